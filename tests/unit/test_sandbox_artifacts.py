"""prepare_artifacts' Claude binary handling against a fake `npm` (no network): extract, checksum, cache."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sweflow.errors import SandboxError
from sweflow.sandbox import artifacts
from sweflow.sandbox.artifacts import artifact_paths, fetch_claude
from sweflow.util import sha256_bytes

FAKE_NPM = r"""#!{python}
import io, json, sys, tarfile
from pathlib import Path
args = sys.argv[1:]
log = Path({log!r})
log.write_text(log.read_text() + " ".join(args) + "\n" if log.exists() else " ".join(args) + "\n")
spec = args[1]
if not spec.endswith("@2.1.7"):
    print("npm error 404 No match found for version", file=sys.stderr)
    sys.exit(1)
dest = Path(args[args.index("--pack-destination") + 1])
payload = b"\x7fELF fake claude " + spec.encode()
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as tar:
    for name, data in (("package/package.json", b"{{}}"), ("package/claude", payload)):
        info = tarfile.TarInfo(name); info.size = len(data); info.mode = 0o755
        tar.addfile(info, io.BytesIO(data))
(dest / "fake-2.1.7.tgz").write_bytes(buf.getvalue())
print(json.dumps([{{"filename": "fake-2.1.7.tgz", "integrity": "sha512-fake", "shasum": "abc"}}]))
"""


@pytest.fixture()
def npm(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "npm.log"
    script = tmp_path / "npm"
    script.write_text(FAKE_NPM.format(python=sys.executable, log=str(log)))
    script.chmod(0o755)
    return script, log


def test_fetch_claude_extracts_binary_records_checksums_and_caches(tmp_path, npm):
    script, log = npm
    out = tmp_path / "art"
    out.mkdir()
    info = fetch_claude(out, "2.1.7", npm=str(script))
    binary = out / "claude"
    expected = b"\x7fELF fake claude @anthropic-ai/claude-code-linux-x64@2.1.7"
    assert binary.read_bytes() == expected
    assert binary.stat().st_mode & 0o111
    assert info["sha256"] == sha256_bytes(expected) and info["size"] == len(expected)
    assert info["integrity"] == "sha512-fake" and info["package"].endswith("claude-code-linux-x64@2.1.7")
    assert len(log.read_text().splitlines()) == 1
    # Cached: same version and checksum -> npm is not called again.
    assert fetch_claude(out, "2.1.7", npm=str(script), cached=info) == info
    assert len(log.read_text().splitlines()) == 1
    # A corrupted binary is fetched again.
    binary.write_bytes(b"tampered" + expected[8:])
    assert fetch_claude(out, "2.1.7", npm=str(script), cached=info)["sha256"] == info["sha256"]
    assert len(log.read_text().splitlines()) == 2
    assert not list(out.glob("sweflow-npm-*")), "temp folders are cleaned up"


def test_fetch_claude_unknown_version_names_the_field(tmp_path, npm):
    script, _ = npm
    with pytest.raises(SandboxError) as ei:
        fetch_claude(tmp_path, "9.9.9", npm=str(script))
    assert ei.value.field == "claude_version" and "9.9.9" in str(ei.value)
    with pytest.raises(SandboxError, match="npm not found"):
        fetch_claude(tmp_path, "2.1.7", npm=str(tmp_path / "no-npm"))


def test_prepare_artifacts_writes_manifest_and_reuses_it(tmp_path, npm, monkeypatch):
    script, log = npm
    wheel_calls = []

    def fake_wheel(out_dir, *, source_root=None, cached=None):
        wheel_calls.append(cached)
        (out_dir / "sweflow-0.1.0-py3-none-any.whl").write_bytes(b"wheel")
        return {"path": "sweflow-0.1.0-py3-none-any.whl", "sha256": sha256_bytes(b"wheel"), "size": 5}

    monkeypatch.setattr(artifacts, "build_wheel", fake_wheel)
    out = tmp_path / "art"
    m1 = artifacts.prepare_artifacts(out, "2.1.7", npm=str(script))
    manifest = out / "manifest.json"
    assert json.loads(manifest.read_text()) == m1
    mtime = manifest.stat().st_mtime_ns
    m2 = artifacts.prepare_artifacts(out, "2.1.7", npm=str(script))
    assert m2 == m1 and manifest.stat().st_mtime_ns == mtime
    assert len(log.read_text().splitlines()) == 1 and wheel_calls[1] == m1["wheel"]
    paths = artifact_paths(out)
    assert paths["claude"] == (out / "claude").resolve() and paths["wheel"].name.endswith(".whl")
