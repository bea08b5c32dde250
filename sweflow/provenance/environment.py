"""What made an artifact besides its inputs: the sweflow source tree, the git checkout, software versions."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import sweflow
from sweflow.util import log, run_cmd, sha256_file

# Distributions whose versions matter for reproducing an artifact; absent ones are simply left out.
SOFTWARE = (
    "snakemake",
    "huggingface_hub",
    "pyarrow",
    "pandas",
    "swegym",
    "swebench",
    "e2b",
    "docker",
    "torch",
    "transformers",
)


@functools.lru_cache(maxsize=8)
def sweflow_tree_sha256(subpackage: str = "") -> str:
    """Hash of the installed sweflow package's files (bytecode caches excluded); with `subpackage` ("train"),
    of that subpackage's files only."""
    pkg = Path(sweflow.__file__).resolve().parent.joinpath(*subpackage.split(".") if subpackage else ())
    h = hashlib.sha256()
    for f in sorted(pkg.rglob("*")):
        if (
            not f.is_file()
            or "__pycache__" in f.parts
            or f.suffix in (".pyc", ".pyo")
            or f.name.endswith(".tmp")
        ):
            continue
        h.update(f.relative_to(pkg).as_posix().encode() + b"\0" + sha256_file(f).encode() + b"\n")
    return h.hexdigest()


def git_state(path: str | os.PathLike) -> dict[str, Any] | None:
    """{commit, dirty} of the git checkout containing `path`; None when git or the checkout is absent.

    dirty means tracked files differ from HEAD (untracked files, e.g. results, do not count).
    """
    p = Path(path)
    where = p if p.is_dir() else p.parent
    if not where.exists():
        return None
    try:
        top = run_cmd(["git", "-C", str(where), "rev-parse", "--show-toplevel"], timeout=30)
        if top.returncode != 0:
            return None
        return _git_state_of(top.stdout.strip())
    except (
        Exception
    ) as exc:  # git missing (OSError) or hung (TimeoutExpired): provenance must not fail the job
        log.warning("git state unavailable for %s: %s", p, exc)
        return None


def _git_state_of(top: str) -> dict[str, Any] | None:
    head = run_cmd(["git", "-C", top, "rev-parse", "HEAD"], timeout=30)
    commit = head.stdout.strip() if head.returncode == 0 else None
    status = run_cmd(["git", "-C", top, "status", "--porcelain", "--untracked-files=no"], timeout=120)
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return {"commit": commit, "dirty": dirty}


def software_versions() -> dict[str, str]:
    """Python and the installed versions of the packages in SOFTWARE (metadata only; nothing is imported)."""
    return {
        "python": platform.python_version(),
        "sweflow": sweflow.__version__,
        **installed_versions(SOFTWARE),
    }


def installed_versions(dists: Iterable[str]) -> dict[str, str]:
    """The installed version of each of `dists` that is installed (metadata only; nothing is imported)."""
    out = {}
    for dist in dists:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out
