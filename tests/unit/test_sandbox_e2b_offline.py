"""E2B backend pieces that need no server: template construction (offline Dockerfile/JSON), spec
hashing, step naming, error classification, key handling."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest
from e2b import (
    AuthenticationException,
    NotFoundException,
    RateLimitException,
    SandboxException,
    Template,
    TimeoutException,
)

from sweflow.errors import SandboxError
from sweflow.sandbox.e2b import E2BProvider, _TailBuffer
from sweflow.sandbox.e2b_api import is_transient
from sweflow.sandbox.e2b_template import (
    describe_step,
    e2b_template_from_spec,
    template_inputs,
    template_spec_hash,
    template_steps,
)
from sweflow.sandbox.spec import DEFAULT_START_CMD, RUNTIME_DIR, WHEEL_DIR, TemplateSpec, runtime_install_cmd

IMAGE = "sweflow-sample/sweb.eval.x86_64.sweflow_s_calclib-1:latest"


@pytest.fixture
def files(tmp_path):
    claude = tmp_path / "a" / "claude"
    claude.parent.mkdir()
    claude.write_bytes(b"\x7fELF fake claude")
    wheel = tmp_path / "b" / "sweflow-0.1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"PK wheel")
    return claude, wheel


def test_to_dockerfile_offline(files):
    claude, wheel = files
    tpl = e2b_template_from_spec(image=IMAGE, packages=["git"], claude_binary=claude, runtime_wheel=wheel)
    lines = Template.to_dockerfile(tpl).splitlines()
    assert lines[0] == f"FROM {IMAGE}"
    assert lines[1] == "USER root"
    assert lines[2].startswith("RUN apt-get update && ")
    assert lines[2].endswith("install -y --no-install-recommends git python3 python3-venv curl")
    assert lines[3] == "COPY claude /usr/local/bin/claude"
    assert lines[4] == f"COPY {wheel.name} {WHEEL_DIR}/{wheel.name}"
    assert lines[5] == f"RUN {runtime_install_cmd(f'{WHEEL_DIR}/{wheel.name}')}"
    assert f"-m venv {RUNTIME_DIR}" in lines[5] and "--no-deps" in lines[5]
    assert lines[6] == "WORKDIR /testbed"
    assert lines[7] == f"ENTRYPOINT {DEFAULT_START_CMD}"
    assert (
        f"{RUNTIME_DIR}/bin/python -m sweflow.blackbox" in DEFAULT_START_CMD and "31000" in DEFAULT_START_CMD
    )


def test_renders_a_template_spec_and_its_env(files):
    claude, wheel = files
    spec = TemplateSpec(image=IMAGE, claude_binary=claude, runtime_wheel=wheel, env=(("LANG", "C.UTF-8"),))
    lines = Template.to_dockerfile(e2b_template_from_spec(spec)).splitlines()
    assert "ENV LANG=C.UTF-8" in lines
    apt = lines[2]
    for pkg in (*spec.packages, "python3", "python3-venv"):
        assert f" {pkg}" in apt
    assert apt.count(" curl") == 1  # already in the spec's packages: not added twice


def test_to_json_has_ready_check_modes_and_hashes(files):
    claude, wheel = files
    tpl = e2b_template_from_spec({"image": IMAGE, "claude_binary": claude, "runtime_wheel": wheel})
    data = json.loads(Template.to_json(tpl))
    assert data["fromImage"] == IMAGE
    assert "curl" in data["readyCmd"] and "http://127.0.0.1:31000/health" in data["readyCmd"]
    copies = [s for s in data["steps"] if s["type"] == "COPY"]
    assert [c["args"][3] for c in copies] == ["0755", "0644"]
    assert all(len(c["filesHash"]) == 64 for c in copies)


def test_spec_hash_ignores_input_location_but_tracks_content(files, tmp_path):
    claude, wheel = files
    spec = SimpleNamespace(image=IMAGE, packages=("git",), claude_binary=claude, runtime_wheel=wheel, cpu=2)
    h1 = template_spec_hash(e2b_template_from_spec(spec, context_dir=tmp_path / "ctx1"))
    moved = tmp_path / "elsewhere" / "claude-2.0"
    moved.parent.mkdir()
    moved.write_bytes(claude.read_bytes())
    h2 = template_spec_hash(e2b_template_from_spec(spec, context_dir=tmp_path / "ctx2", claude_binary=moved))
    assert h1 == h2
    wheel.write_bytes(b"PK wheel v2")
    h3 = template_spec_hash(e2b_template_from_spec(spec, context_dir=tmp_path / "ctx3"))
    assert h3 != h1
    h4 = template_spec_hash(
        e2b_template_from_spec(spec, context_dir=tmp_path / "ctx4", packages=["git", "vim"])
    )
    assert h4 not in (h1, h3)


def test_inputs_validation(files):
    claude, wheel = files
    with pytest.raises(SandboxError, match="runtime_wheel"):
        template_inputs(image=IMAGE, claude_binary=claude)
    with pytest.raises(SandboxError, match="colour"):
        template_inputs(image=IMAGE, claude_binary=claude, runtime_wheel=wheel, colour="red")
    with pytest.raises(SandboxError, match="/missing/claude"):
        e2b_template_from_spec(image=IMAGE, claude_binary="/missing/claude", runtime_wheel=wheel)
    got = template_inputs({"image": IMAGE, "claude_binary": claude, "runtime_wheel": wheel}, start_cmd="x")
    assert got.start_cmd == "x" and got.health_url.endswith(":31000/health")


def test_describe_step(files):
    claude, wheel = files
    steps = template_steps(e2b_template_from_spec(image=IMAGE, claude_binary=claude, runtime_wheel=wheel))
    assert describe_step("base", steps, IMAGE) == f"step base (FROM {IMAGE})"
    assert describe_step("3", steps, IMAGE) == "step 3 (COPY claude)"
    assert describe_step("finalize", steps, IMAGE).startswith("step finalize")
    assert describe_step("99", steps, IMAGE) == "step 99"
    assert describe_step(None, steps, IMAGE) == "unknown step"


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (SandboxException("500: boom", status_code=500), True),
        (SandboxException("503: busy", status_code=503), True),
        (RateLimitException("slow down"), True),
        (TimeoutException("took too long"), True),
        (httpx.ReadTimeout("read timed out"), True),
        (httpx.ConnectError("refused"), True),
        (SandboxException("404: template 'x' not found", status_code=404), False),
        (NotFoundException("nope"), False),
        (AuthenticationException("401: Unauthorized"), False),
        (Exception("502: from a BuildException message"), True),
        (ValueError("bad argument"), False),
    ],
)
def test_is_transient(exc, transient):
    assert is_transient(exc) is transient


def test_provider_needs_a_key_and_hides_it(monkeypatch):
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    with pytest.raises(SandboxError, match="E2B_API_KEY"):
        E2BProvider()
    secret = "e2b_test_SECRET_unit_000000"
    monkeypatch.setenv("E2B_API_KEY", secret)
    p = E2BProvider()
    assert secret not in repr(p)
    assert p.api_params()["api_key"] == secret and p.api_params()["retries"] == 0
    assert p.clean(f"boom with {secret}\nsecond line") == "boom with ***REDACTED*** second line"


def test_port_scheme(monkeypatch):
    for var in ("E2B_SANDBOX_URL", "E2B_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    assert E2BProvider("k" * 10)._port_scheme() == "https"
    assert E2BProvider("k" * 10, debug=True)._port_scheme() == "http"
    assert E2BProvider("k" * 10, sandbox_url="http://127.0.0.1:5")._port_scheme() == "http"
    monkeypatch.setenv("E2B_SANDBOX_URL", "https://sandbox.example")
    assert E2BProvider("k" * 10)._port_scheme() == "https"


def test_tail_buffer_keeps_the_end():
    buf = _TailBuffer(limit=10)
    for i in range(100):
        buf.add(f"{i:03d}")
    assert buf.text() == "".join(f"{i:03d}" for i in range(100))[-10:] == "6097098099"
    assert buf.size <= 2 * 10 + 3  # memory stays bounded
