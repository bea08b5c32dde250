"""Template spec hashing, names and rendering; provider registry; build records and retries (no daemons)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sweflow.errors import ConfigError, SandboxError
from sweflow.sandbox.base import TemplateRecord
from sweflow.sandbox.build import build_and_record, build_template, step_of, write_build_record
from sweflow.sandbox.images import sample_image_name
from sweflow.sandbox.registry import get_provider
from sweflow.sandbox.spec import NAME_MAX, TemplateSpec, template_name

IMG = "sweflow-sample/sweb.eval.x86_64.sweflow_s_calclib-1:latest"


@pytest.fixture()
def arts(tmp_path: Path) -> tuple[Path, Path]:
    claude = tmp_path / "claude"
    claude.write_bytes(b"#!/bin/sh\necho 2.1.0\n")
    wheel = tmp_path / "sweflow-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a zip")
    return claude, wheel


def test_spec_hash_is_stable_and_covers_every_input(arts, tmp_path):
    claude, wheel = arts
    base = TemplateSpec(image=IMG, claude_binary=claude, runtime_wheel=wheel)
    assert base.spec_hash() == TemplateSpec(image=IMG, claude_binary=claude, runtime_wheel=wheel).spec_hash()
    assert re.fullmatch(r"[0-9a-f]{64}", base.spec_hash())
    variants = [
        TemplateSpec(image=IMG + "x", claude_binary=claude, runtime_wheel=wheel),
        TemplateSpec(image=IMG, claude_binary=claude, runtime_wheel=wheel, packages=("bash",)),
        TemplateSpec(image=IMG, claude_binary=claude, runtime_wheel=wheel, start_cmd="sleep 1"),
        TemplateSpec(image=IMG, claude_binary=claude, runtime_wheel=wheel, memory_mb=1),
        TemplateSpec(image=IMG, runtime_wheel=wheel),
    ]
    hashes = {v.spec_hash() for v in variants} | {base.spec_hash()}
    assert len(hashes) == len(variants) + 1
    # Same path, different bytes: the artifact checksum must change the hash.
    other = tmp_path / "other"
    other.mkdir()
    claude2 = other / "claude"
    claude2.write_bytes(b"#!/bin/sh\necho 2.1.1\n")
    assert TemplateSpec(image=IMG, claude_binary=claude2, runtime_wheel=wheel).spec_hash() != base.spec_hash()
    # Package order does not matter.
    a = TemplateSpec(image=IMG, packages=("git", "bash")).spec_hash()
    assert a == TemplateSpec(image=IMG, packages=("bash", "git")).spec_hash()


@pytest.mark.parametrize(
    "image",
    [
        IMG,
        "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-7365:latest",
        "swebench/sweb.eval.x86_64.django_1776_django-11099:v2",
        "registry.example:5000/Some_Org/" + "very-long-name." * 10 + ":TAG",
        "ubuntu",
    ],
)
def test_template_names_are_e2b_valid_and_deterministic(image):
    name = template_name(image)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name), name
    assert len(name) <= NAME_MAX
    assert name == template_name(image)
    assert re.search(r"-[0-9a-f]{8}$", name)


def test_template_names_differ_for_images_that_slug_alike():
    assert template_name("a/x_y:latest") != template_name("b/x.y:latest")
    assert template_name(IMG) == template_name(IMG)
    assert "calclib-1" in template_name(IMG)


def test_sample_image_name_follows_the_facts_rule():
    assert (
        sample_image_name("sweflow__calclib-3")
        == "sweflow-sample/sweb.eval.x86_64.sweflow_s_calclib-3:latest"
    )


def test_dockerfile_renders_root_packages_claude_runtime_and_start(arts):
    claude, wheel = arts
    spec = TemplateSpec(image=IMG, claude_binary=claude, runtime_wheel=wheel, env=(("A", 'x"y'),))
    df = spec.to_dockerfile()
    lines = df.splitlines()
    assert lines[0] == f"FROM {IMG}" and lines[1] == "USER root"
    assert "COPY claude /usr/local/bin/claude" in lines
    assert f"COPY {wheel.name} /opt/sweflow/wheel/{wheel.name}" in lines
    assert any("python3 -m venv /opt/sweflow/runtime" in ln and "--no-deps" in ln for ln in lines)
    for pkg in ("bash", "curl", "git", "patch", "ca-certificates", "python3-venv"):
        assert pkg in next(ln for ln in lines if "dpkg -s" in ln)
    assert lines[-1].startswith("CMD [") and "sweflow.blackbox" in lines[-1]
    assert json.loads(lines[-1][4:])[:2] == ["/bin/bash", "-c"]
    assert 'ENV A="x\\"y"' in lines
    assert any(ln.startswith("HEALTHCHECK") for ln in lines)
    via = spec.to_dockerfile(artifacts_image="sweflow-artifacts:abc")
    assert "COPY --from=sweflow-artifacts:abc /claude /usr/local/bin/claude" in via
    assert "\nCOPY claude " not in via
    per_file = spec.to_dockerfile(artifacts_image={"claude": "img-c"})
    assert "COPY --from=img-c /claude /usr/local/bin/claude" in per_file
    assert f"COPY {wheel.name} /opt/sweflow/wheel/{wheel.name}" in per_file, (
        "unmapped files come from the context"
    )


def test_e2b_inputs_carry_the_same_steps(arts):
    claude, wheel = arts
    spec = TemplateSpec(image=IMG, claude_binary=claude, runtime_wheel=wheel, cpu=4, memory_mb=2048)
    data = spec.e2b_inputs()
    kinds = [s["kind"] for s in data["steps"]]
    assert kinds == ["apt", "copy", "copy", "run"]
    assert data["steps"][1]["src"] == str(claude) and data["steps"][1]["mode"] == 0o755
    assert data["ready_url"] == "http://127.0.0.1:31000/health"
    assert (data["cpu"], data["memory_mb"]) == (4, 2048)


def test_registry_rejects_unknown_provider_and_builds_local(tmp_path):
    with pytest.raises(ConfigError, match="unknown sandbox provider 'nope'"):
        get_provider("nope")
    p = get_provider("local", templates_root=tmp_path)
    assert p.name == "local" and p.root == tmp_path


class FakeProvider:
    """Fails `fail` times, then builds; counts calls."""

    name = "fake"

    def __init__(self, fail: int, error: str = "Step 3/9 : RUN apt-get install x failed: exit 100") -> None:
        self.fail, self.error, self.calls = fail, error, 0
        self.built: set[str] = set()

    def build(self, spec, name, **source):
        self.calls += 1
        if self.calls <= self.fail:
            raise SandboxError(self.error, file=spec.image, field="build")
        self.built.add(name)
        return TemplateRecord(image=spec.image, provider=self.name, template=name, spec_hash=spec.spec_hash())

    def has_template(self, name):
        return name in self.built


def test_build_template_retries_then_succeeds():
    p = FakeProvider(fail=2)
    rec = build_template(p, IMG, spec=TemplateSpec(image=IMG), attempts=3, backoff=0)
    assert p.calls == 3 and rec.template == template_name(IMG)


def test_build_template_final_failure_names_image_and_step():
    p = FakeProvider(fail=5)
    with pytest.raises(SandboxError) as ei:
        build_template(p, IMG, spec=TemplateSpec(image=IMG), attempts=2, backoff=0)
    assert p.calls == 2
    assert ei.value.file == IMG and ei.value.field == "Step 3/9 : RUN apt-get install x"
    assert IMG in str(ei.value) and "after 2 attempt(s)" in str(ei.value)


def test_step_of_falls_back_to_field():
    assert step_of(SandboxError("x", field="FROM")) == "FROM"
    assert step_of(RuntimeError("boom")) == "build"


def test_build_and_record_skips_unchanged_spec_and_records_failures(tmp_path, monkeypatch):
    rec_path = tmp_path / "rec.json"
    p = FakeProvider(fail=0)
    spec = TemplateSpec(image=IMG)
    first = build_and_record(p, IMG, rec_path, spec=spec, attempts=1)
    assert first["ok"] is True and p.calls == 1
    again = build_and_record(p, IMG, rec_path, spec=spec, attempts=1)
    assert again == first and p.calls == 1, "same spec hash: no rebuild"
    build_and_record(p, IMG, rec_path, spec=TemplateSpec(image=IMG, start_cmd="true"), attempts=1)
    assert p.calls == 2, "changed spec: rebuilt"
    # The template vanished from the provider: rebuilt even though the record matches.
    p.built.clear()
    build_and_record(p, IMG, rec_path, spec=TemplateSpec(image=IMG, start_cmd="true"), attempts=1)
    assert p.calls == 3

    secret = "sk-ant-secret-value-123456"
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)
    bad = FakeProvider(fail=9, error=f"Step 2/5 : RUN curl -H {secret} failed: 401")
    fail_path = tmp_path / "fail.json"
    data = build_and_record(bad, IMG, fail_path, spec=spec, attempts=1)
    on_disk = json.loads(fail_path.read_text())
    assert on_disk == data
    assert data["ok"] is False and data["image"] == IMG and data["step"].startswith("Step 2/5 : RUN curl")
    assert secret not in fail_path.read_text()


def test_write_build_record_is_byte_stable(tmp_path):
    rec = TemplateRecord(image=IMG, provider="docker", template="t", spec_hash="h", build_id="b")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_build_record(a, record=rec)
    write_build_record(b, record=rec)
    assert a.read_bytes() == b.read_bytes()
    assert list(json.loads(a.read_text())) == sorted(json.loads(a.read_text()))
    with pytest.raises(SandboxError):
        write_build_record(tmp_path / "c.json", error="x")
