"""The image -> template map: from per-image build records, or (prebuilt images) from the image listing
with no job per image; a prebuilt image's smoke test starts the image itself."""

from __future__ import annotations

import json

import pytest

import sweflow.sandbox.smoke
from sweflow.errors import DatasetError
from sweflow.stages.data import template_map
from sweflow.stages.sandbox import smoke_step


def test_build_records_give_templates_and_failure_reasons(tmp_path):
    recs = []
    for n, rec in enumerate([{"image": "a:1", "template": "tpl-a", "ok": True},
                             {"image": "b:1", "ok": False, "step": "build", "error": "apt failed"}]):  # fmt: skip
        p = tmp_path / f"{n}.json"
        p.write_text(json.dumps(rec))
        recs.append(str(p))
    mapping, failures = template_map(recs, tmp_path / "map.json", tmp_path / "fail.json")
    assert mapping == {"a:1": "tpl-a"} and failures == {"b:1": "build: apt failed"}
    assert json.loads((tmp_path / "fail.json").read_text()) == failures
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DatasetError, match="no image"):
        template_map([str(tmp_path / "bad.json")], tmp_path / "m2.json", tmp_path / "f2.json")


def test_prebuilt_images_map_to_themselves_from_the_listing(tmp_path):
    listing = tmp_path / "images.txt"
    listing.write_text("org/img-b:latest\norg/img-a:latest\n\n")
    mapping, failures = template_map(
        [str(listing)], tmp_path / "map.json", tmp_path / "f.json", prebuilt=True
    )
    assert mapping == {"org/img-a:latest": "org/img-a:latest", "org/img-b:latest": "org/img-b:latest"}
    assert failures == {}
    assert list(json.loads((tmp_path / "map.json").read_text())) == ["org/img-a:latest", "org/img-b:latest"]


def test_prebuilt_smoke_starts_the_image_itself(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(
        sweflow.sandbox.smoke, "smoke", lambda prov, template: started.append(template) or {"ok": True}
    )
    monkeypatch.setattr("sweflow.stages.sandbox.provider_from_config", lambda name, cfg: object())
    rec = tmp_path / "image.json"
    rec.write_text(json.dumps({"image": "org/img-a:latest", "instances": []}))
    marker = smoke_step(rec, tmp_path / "m.json", provider="docker", cfg={"prebuilt": True})
    assert started == ["org/img-a:latest"] and marker["ok"] and marker["template"] == "org/img-a:latest"
