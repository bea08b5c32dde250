"""The sandbox stage under real Snakemake: templates built and smoke-tested with the local provider (bwrap)
and the Docker provider (real engine), a failing image reported per item without stopping the run."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml
from test_pipeline_data import snakemake

from sweflow.offline.hub_store import HubStore
from sweflow.offline.local_hub import publish_sample, serve
from sweflow.sample import skyrl_rows, write_parquet

pytestmark = pytest.mark.integration


def docker_ok() -> bool:
    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@pytest.fixture
def hub(tmp_path):
    root = tmp_path / "hub"
    publish_sample(root)
    with serve(HubStore(root)) as url:
        yield root, url


def config(work, url, provider, **sandbox):
    cfg = {
        "dataset": {
            "hub": {"endpoint": url},
            "splits": {"validation": {"file": "validation.parquet", "rows": None}},
            "select_splits": ["validation"],
        },
        "images": {"prefix": "sweflow-sample/sweb.eval.x86_64."},
        "harness": {"package": "swebench", "extra_repos": "sample"},
        "sandbox": {"provider": provider, "build_attempts": 1, **sandbox},
        "e2e": {"instance": "sweflow__calclib-4"},
    }
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))


def test_local_provider_builds_and_smokes_every_template(embedded_local_run):
    """The embedded default's run (tests/integration/conftest.py) built and smoke-tested every template with
    the local provider, validated on them and ran the end-to-end check; its rerun doing nothing is checked
    in test_train_pipeline.py."""
    work = embedded_local_run
    summary = json.loads((work / "results/sample/smoke-local.json").read_text())
    assert summary == {"templates": 8, "ok": 8, "failed": []}
    markers = list((work / "results/sample/smoke/local").glob("*.json"))
    assert len(markers) == 8
    for marker in markers:
        data = json.loads(marker.read_text())
        assert data["ok"] and data["version"] and data["host_reachable"] is True
    mapping = json.loads((work / "results/sample/template-map.json").read_text())
    assert len(mapping) == 8 and all(v != k for k, v in mapping.items())
    for split, tasks in (("train", 6), ("validation", 2)):
        validation = json.loads((work / f"results/sample/{split}/validation-summary.json").read_text())
        assert validation["valid"] == validation["tasks"] == tasks and validation["broken"] == [], validation
    e2e = json.loads((work / "results/sample/e2e/sweflow__calclib-3.json").read_text())
    assert e2e["ok"] and e2e["policies"]["gold"]["reward"] == 1.0
    assert e2e["policies"]["test_edit"]["reward"] == 0.0


@pytest.mark.docker
@pytest.mark.skipif(not docker_ok(), reason="no Docker engine")
def test_docker_provider_one_failing_image_does_not_stop_the_run(tmp_path, hub):
    hub_root, url = hub
    rows = skyrl_rows("validation")
    broken = json.loads(json.dumps(rows[0]))
    broken["instance"].update(instance_id="acme__widgets-1", repo="acme/widgets")
    write_parquet([*rows, broken], tmp_path / "v.parquet")
    HubStore(hub_root).publish(
        "sweflow/calclib-sample",
        {"validation.parquet": (tmp_path / "v.parquet").read_bytes()},
        "add a row whose image does not exist",
    )
    work = tmp_path / "w"
    work.mkdir()
    config(work, url, "docker")
    snakemake(work, "results/sample/smoke-docker.json", "results/sample/validation.jsonl")

    failures = json.loads((work / "results/sample/template-failures.json").read_text())
    assert list(failures) == ["sweflow-sample/sweb.eval.x86_64.acme_s_widgets-1:latest"]
    assert "FROM" in failures["sweflow-sample/sweb.eval.x86_64.acme_s_widgets-1:latest"]
    summary = json.loads((work / "results/sample/smoke-docker.json").read_text())
    assert summary["templates"] == 3 and summary["ok"] == 2
    assert summary["failed"][0]["image"].endswith("acme_s_widgets-1:latest")
    report = json.loads((work / "results/sample/validation.convert.json").read_text())
    assert report["rows"] == 2 and [s["instance_id"] for s in report["skipped"]] == ["acme__widgets-1"]
    for line in (work / "results/sample/validation.jsonl").read_text().splitlines():
        template = json.loads(line)["metadata"]["sandbox_image"]
        inspect = subprocess.run(["docker", "image", "inspect", template], capture_output=True)
        assert inspect.returncode == 0, f"template image {template} missing"
