"""Local Docker images: a Debian base from debootstrap and one task image per sample row.

No registry is reachable, so the base is built with `debootstrap` and `docker import`; the rootfs tarball is
cached (keyed by suite, packages and mirror) so CI reruns only pay for the import. Task images mimic the
SWE-bench layout (see above `_task_context`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import SandboxError
from ..util import atomic_write_json, log, run_cmd, sha256_bytes, stable_json

BASE_TAG = "sweflow/base:bookworm"
BASE_SUITE = "bookworm"
BASE_PACKAGES = (
    "python3",
    "python3-venv",
    "python3-pytest",
    "git",
    "patch",
    "bash",
    "curl",
    "ca-certificates",
)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SAMPLE_PREFIX = "sweflow-sample"

# Sourcing this defines `conda`; `conda activate <env>` only puts the system python on PATH, which is all
# the SWE-bench eval scripts need from it.
CONDA_ACTIVATE = """\
# sweflow conda shim: a stand-in for miniconda in locally built task images.
export CONDA_PREFIX=/opt/miniconda3/envs/testbed
export CONDA_DEFAULT_ENV=testbed
export PATH="/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:$PATH"
conda() {
    case "$1" in
        activate|deactivate) return 0 ;;
        *) echo "sweflow conda shim: unsupported: conda $*" >&2; return 1 ;;
    esac
}
"""
CONDA_BIN = '#!/bin/sh\n. /opt/miniconda3/bin/activate\nconda "$@"\n'


def cache_dir() -> Path:
    """Where rootfs tarballs are cached: $SWEFLOW_CACHE/images, else ~/.cache/sweflow/images."""
    root = os.environ.get("SWEFLOW_CACHE") or str(Path.home() / ".cache" / "sweflow")
    return Path(root) / "images"


def image_exists(tag: str, *, timeout: float = 60) -> bool:
    res = run_cmd(["docker", "image", "inspect", tag], timeout=timeout)
    return res.returncode == 0


def _docker(args: list[str], *, timeout: float, what: str, input: bytes | None = None) -> str:
    try:
        res = run_cmd(["docker", *args], timeout=timeout, input=input)
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"{what}: docker {args[0]} timed out after {timeout:.0f}s") from exc
    if res.returncode != 0:
        raise SandboxError(f"{what}: docker {args[0]} failed: {res.stderr.strip()[-500:]}")
    return res.stdout


def rootfs_tarball(
    *, suite: str = BASE_SUITE, packages: Iterable[str] = BASE_PACKAGES, mirror: str | None = None
) -> Path:
    """Build (or reuse from cache) a minbase rootfs tarball with `packages`."""
    mirror = mirror or os.environ.get("SWEFLOW_DEBIAN_MIRROR") or DEFAULT_MIRROR
    pkgs = sorted(set(packages))
    key = sha256_bytes(stable_json({"suite": suite, "packages": pkgs, "mirror": mirror}))[:16]
    out = cache_dir() / f"rootfs-{suite}-{key}.tar"
    if out.exists():
        return out
    if shutil.which("debootstrap") is None:
        raise SandboxError("debootstrap is not installed", hint="apt-get install debootstrap")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sweflow-rootfs-", dir=out.parent) as tmp:
        root = Path(tmp) / "root"
        cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(pkgs)}", suite, str(root), mirror]
        log.info("debootstrap %s into %s", suite, root)
        res = run_cmd(cmd, timeout=1800)
        if res.returncode != 0:
            raise SandboxError(
                f"debootstrap {suite} failed (exit {res.returncode}): {(res.stderr or res.stdout)[-500:]}",
                file=str(root),
            )
        # Apt lists and caches only bloat the image.
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (root / sub).glob("*"):
                if p.is_file():
                    p.unlink()
        part = out.with_suffix(".tar.part")
        res = run_cmd(["tar", "--numeric-owner", "-C", str(root), "-cf", str(part), "."], timeout=600)
        if res.returncode != 0:
            raise SandboxError(f"tar of rootfs failed: {res.stderr[-500:]}", file=str(root))
        os.replace(part, out)
    return out


def build_base_image(tag: str = BASE_TAG, *, mirror: str | None = None, force: bool = False) -> str:
    """Build the Debian base image with debootstrap and `docker import`; skipped when `tag` exists."""
    if not force and image_exists(tag):
        return tag
    tarball = rootfs_tarball(mirror=mirror)
    _docker(
        ["import", "--change", 'CMD ["/bin/bash"]', "--change", "ENV LANG=C.UTF-8", str(tarball), tag],
        timeout=900,
        what=f"import base image {tag}",
    )
    return tag


# Task images mimic the SWE-bench layout: the repo at /testbed at the base commit with its remote removed, and
# a conda shim at /opt/miniconda3 so the official eval scripts (`source /opt/miniconda3/bin/activate; conda
# activate testbed`) run.
def _task_context(repo_path: Path, base_commit: str, base: str, dest: Path) -> None:
    """Write a docker build context: a clean clone at base_commit plus the conda shim."""
    testbed = dest / "testbed"
    res = run_cmd(["git", "clone", "--quiet", "--no-hardlinks", str(repo_path), str(testbed)], timeout=300)
    if res.returncode != 0:
        raise SandboxError(f"git clone failed: {res.stderr.strip()}", file=str(repo_path))
    for args in (
        ["checkout", "--quiet", "--detach", base_commit],
        ["remote", "remove", "origin"],
    ):
        res = run_cmd(["git", "-C", str(testbed), *args], timeout=120)
        if res.returncode != 0:
            raise SandboxError(
                f"git {args[0]} failed: {res.stderr.strip()}", file=str(repo_path), field=base_commit
            )
    shim = dest / "miniconda3" / "bin"
    shim.mkdir(parents=True)
    (shim / "activate").write_text(CONDA_ACTIVATE)
    (shim / "conda").write_text(CONDA_BIN)
    (shim / "conda").chmod(0o755)
    envbin = dest / "miniconda3" / "envs" / "testbed" / "bin"
    envbin.mkdir(parents=True)
    (dest / "Dockerfile").write_text(
        f"FROM {base}\n"
        "COPY miniconda3 /opt/miniconda3\n"
        "RUN ln -s /usr/bin/python3 /opt/miniconda3/envs/testbed/bin/python"
        " && git config --system --add safe.directory '*'\n"
        "COPY testbed /testbed\n"
        "WORKDIR /testbed\n"
    )


def build_task_image(
    tag: str, repo_path: str | os.PathLike, base_commit: str, *, base: str = BASE_TAG, force: bool = False
) -> str:
    """Build a SWE-bench-like task image: repo at /testbed at `base_commit` (no remote) + conda shim."""
    if not force and image_exists(tag):
        return tag
    with tempfile.TemporaryDirectory(prefix="sweflow-task-") as tmp:
        _task_context(Path(repo_path), base_commit, base, Path(tmp))
        _docker(
            ["build", "--network", "none", "-q", "-t", tag, tmp], timeout=900, what=f"build task image {tag}"
        )
    return tag


def sample_image_name(instance_id: str, prefix: str = SAMPLE_PREFIX) -> str:
    """The FACTS.md naming rule for sample task images."""
    return f"{prefix}/sweb.eval.x86_64.{instance_id.replace('__', '_s_').lower()}:latest"


def build_sample_images(
    rows: Iterable[dict[str, Any]], prefix: str = SAMPLE_PREFIX, *, repo_path: str | os.PathLike | None = None
) -> list[str]:
    """Build the task image for every sample row (base image first); returns the tags in row order.

    `repo_path` is the materialised sample repo; by default it is materialised with sweflow.sample.
    """
    build_base_image()
    tmp = None
    if repo_path is None:
        from ..sample import materialize_repo  # late: the sample package is optional here

        tmp = tempfile.TemporaryDirectory(prefix="sweflow-sample-")
        repo_path = materialize_repo(Path(tmp.name) / "repo")
    try:
        tags = []
        for row in rows:
            tag = sample_image_name(row["instance_id"], prefix)
            build_task_image(tag, repo_path, row["base_commit"])
            tags.append(tag)
        return tags
    finally:
        if tmp is not None:
            tmp.cleanup()


def write_image_manifest(path: str | os.PathLike, tags: list[str]) -> None:
    """Record the built tags with their image ids (byte-stable)."""
    ids = {}
    for t in tags:
        ids[t] = _docker(["image", "inspect", "-f", "{{.Id}}", t], timeout=60, what=f"inspect {t}").strip()
    atomic_write_json(path, {"images": ids})
