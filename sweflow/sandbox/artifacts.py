"""Build-once artifacts shared by every template: the Claude Code native binary and the sweflow wheel.

The binary comes from the platform package `@anthropic-ai/claude-code-linux-x64@<ver>` (the main package only
ships a launcher that pulls it in as an optional dependency). The wheel is rebuilt only when the package
sources change, with a fixed SOURCE_DATE_EPOCH so its bytes (and the template spec hashes) stay stable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from ..errors import SandboxError
from ..util import atomic_write_json, log, read_json, run_cmd, sha256_bytes, sha256_file

CLAUDE_PLATFORM_PACKAGE = "@anthropic-ai/claude-code-linux-x64"
MANIFEST = "manifest.json"
SOURCE_DATE_EPOCH = "315532800"  # 1980-01-01, the earliest date a zip can hold


def default_source_root() -> Path:
    """The sweflow project root (where pyproject.toml is) this module was imported from."""
    return Path(__file__).resolve().parents[2]


# What runs inside a sandbox: the blackbox server and nothing else of sweflow (standard library only), so
# editing the rest of the library does not change the runtime wheel and does not rebuild every template.
RUNTIME_PACKAGES = ("sweflow", "sweflow.blackbox")


def runtime_files(root: Path) -> list[Path]:
    """The source files that go into the runtime wheel, in a stable order."""
    files = [root / "sweflow" / "__init__.py"]
    files += sorted((root / "sweflow" / "blackbox").glob("*.py"))
    return files


def source_hash(root: Path) -> str:
    """Hash of what goes into the runtime wheel (the runtime modules and the wheel recipe)."""
    parts = [f"recipe\0{sha256_bytes(_runtime_pyproject(root))}"]
    for f in runtime_files(root):
        parts.append(f"{f.relative_to(root).as_posix()}\0{sha256_file(f)}")
    return sha256_bytes("\n".join(parts))


def _runtime_pyproject(root: Path) -> str:
    """A minimal project for the runtime wheel: the `sweflow` distribution with the runtime packages only."""
    version = "0.0.0"
    for line in (root / "sweflow" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            version = line.split("=", 1)[1].strip().strip("\"'")
    packages = ", ".join(f'"{p}"' for p in RUNTIME_PACKAGES)
    return (
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "sweflow"\nversion = "{version}"\nrequires-python = ">=3.8"\n'
        'description = "sweflow in-sandbox runtime (blackbox server)"\n\n'
        f"[tool.setuptools]\npackages = [{packages}]\n"
    )


def _load(out_dir: Path) -> dict[str, Any]:
    try:
        return read_json(out_dir / MANIFEST)
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def fetch_claude(
    out_dir: Path, version: str, *, npm: str = "npm", cached: dict[str, Any] | None = None
) -> dict:
    """npm pack the platform package, extract `claude`, return {version, sha256, size, integrity, ...}."""
    out_dir = Path(out_dir).resolve()  # npm runs in a temp dir below it: relative paths would double up
    binary = out_dir / "claude"
    if cached and cached.get("version") == version and binary.exists():
        if binary.stat().st_size == cached.get("size") and sha256_file(binary) == cached.get("sha256"):
            return cached
    spec = f"{CLAUDE_PLATFORM_PACKAGE}@{version}"
    with tempfile.TemporaryDirectory(prefix="sweflow-npm-", dir=out_dir) as tmp:
        try:
            res = run_cmd([npm, "pack", spec, "--json", "--pack-destination", tmp], timeout=900, cwd=tmp)
        except FileNotFoundError as exc:
            raise SandboxError(
                f"npm not found: {npm}", field="claude_version", hint="install Node.js"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise SandboxError(f"npm pack {spec} timed out", field="claude_version") from exc
        if res.returncode != 0:
            raise SandboxError(
                f"npm pack {spec} failed: {res.stderr.strip()[-300:]}",
                field="claude_version",
                hint="check that the version exists: npm view @anthropic-ai/claude-code versions",
            )
        info = json.loads(res.stdout)[0]
        tgz = Path(tmp) / info["filename"]
        with tarfile.open(tgz, "r:gz") as tar:
            member = tar.getmember("package/claude")
            src = tar.extractfile(member)
            if src is None:
                raise SandboxError(f"{spec}: package/claude is not a regular file", field="claude_version")
            part = Path(tmp) / "claude.part"
            with open(part, "wb") as fh:
                shutil.copyfileobj(src, fh, 1 << 20)
        part.chmod(0o755)
        os.replace(part, binary)
    return {
        "package": spec,
        "version": version,
        "sha256": sha256_file(binary),
        "size": binary.stat().st_size,
        "integrity": info.get("integrity", ""),
        "tarball_shasum": info.get("shasum", ""),
        "path": "claude",
    }


def build_wheel(
    out_dir: Path, *, source_root: Path | None = None, cached: dict[str, Any] | None = None
) -> dict:
    """Build the runtime wheel (sweflow + sweflow.blackbox, pip wheel --no-deps) unless its sources are
    unchanged since the last build."""
    root = source_root or default_source_root()
    src_hash = source_hash(root)
    if cached and cached.get("source_sha256") == src_hash:
        whl = out_dir / cached.get("path", "")
        if whl.is_file() and sha256_file(whl) == cached.get("sha256"):
            return cached
    env = dict(os.environ, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH, PIP_DISABLE_PIP_VERSION_CHECK="1")
    with tempfile.TemporaryDirectory(prefix="sweflow-wheel-", dir=out_dir) as tmp:
        # Build from a minimal tree of the runtime files only: stale build/ or egg-info in the work tree
        # cannot leak in, and nothing but the runtime decides the wheel's bytes.
        src = Path(tmp) / "src"
        for f in runtime_files(root):
            dest = src / f.relative_to(root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)
        (src / "pyproject.toml").write_text(_runtime_pyproject(root))
        cmd = [
            os.environ.get("SWEFLOW_PYTHON", _python()),
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(Path(tmp) / "dist"),
            str(src),
        ]
        res = run_cmd(cmd, timeout=600, env=env)
        if res.returncode != 0:
            raise SandboxError(
                f"pip wheel failed: {(res.stderr or res.stdout).strip()[-400:]}", file=str(root)
            )
        wheels = sorted((Path(tmp) / "dist").glob("sweflow-*.whl"))
        if len(wheels) != 1:
            raise SandboxError(
                f"expected one sweflow wheel, found {[w.name for w in wheels]}", file=str(root)
            )
        for old in out_dir.glob("sweflow-*.whl"):
            old.unlink()
        dest = out_dir / wheels[0].name
        os.replace(wheels[0], dest)
    return {
        "path": dest.name,
        "sha256": sha256_file(dest),
        "size": dest.stat().st_size,
        "source_sha256": src_hash,
    }


def _python() -> str:
    import sys

    return sys.executable


def prepare_artifacts(
    out_dir: str | os.PathLike,
    claude_version: str,
    *,
    npm: str = "npm",
    source_root: str | os.PathLike | None = None,
    with_claude: bool = True,
) -> dict[str, Any]:
    """Fetch the Claude binary and build the sweflow wheel into out_dir; write out_dir/manifest.json.

    Reuses what is already there when checksums match. Returns the manifest:
    {"claude": {version, sha256, size, integrity, path}, "wheel": {path, sha256, size, source_sha256}};
    paths are relative to out_dir (see `artifact_paths`).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    old = _load(out)
    manifest: dict[str, Any] = {}
    if with_claude:
        manifest["claude"] = fetch_claude(out, claude_version, npm=npm, cached=old.get("claude"))
    manifest["wheel"] = build_wheel(
        out, source_root=Path(source_root) if source_root else None, cached=old.get("wheel")
    )
    if manifest != old:
        atomic_write_json(out / MANIFEST, manifest)
        log.info("artifacts ready in %s: %s", out, sorted(manifest))
    return manifest


def artifact_paths(out_dir: str | os.PathLike, manifest: dict[str, Any] | None = None) -> dict[str, Path]:
    """Absolute paths of the prepared artifacts: {"claude": ..., "wheel": ...} (missing keys omitted)."""
    out = Path(out_dir)
    manifest = manifest if manifest is not None else _load(out)
    return {
        k: (out / v["path"]).resolve() for k, v in manifest.items() if isinstance(v, dict) and "path" in v
    }
