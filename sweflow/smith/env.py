"""A profile's repository as a local bare repository at a resolved commit, and its environment template.

Sources (`materialize_source`): the embedded sample repository, a local git repository or a plain folder.
The environment template is built with the configured provider from that bare repository, or, for E2B,
from the profile's prebuilt `image` (`build_environment`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..errors import SmithError
from ..sandbox.base import Provider
from ..sandbox.settings import SandboxSettings
from .gitrepo import git_out, run_git
from .profile import RepoProfile

FOLDER_DATE = "2000-01-01T00:00:00+00:00"


# Sources: "sample" (the embedded sample repository, materialised with its fixed history), a local git
# repository (cloned bare, every branch and tag), or a plain folder (imported as one commit with a pinned
# identity and date, so the sha is the same on every machine).
def materialize_source(profile: RepoProfile, bare: str | os.PathLike) -> dict[str, Any]:
    """Write the profile's repository as the bare repository `bare` (replaced atomically); resolve the
    commit. Returns {commit, date, subject}."""
    bare = Path(bare).resolve()
    bare.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".smith-src-", dir=bare.parent) as tmp:
        work = Path(tmp) / "src"
        src = profile.source if profile.source == "sample" else os.path.abspath(profile.source)
        if src == "sample":
            from ..sample import materialize_repo

            src = str(materialize_repo(work).path)
        elif not os.path.isdir(src):
            raise SmithError("the repository source is not a folder", file=src, field="source")
        elif not os.path.exists(os.path.join(src, ".git")) and not _is_bare(src):
            shutil.copytree(src, work, symlinks=True, ignore=shutil.ignore_patterns(".git"))
            run_git(work, "init", "-q", "--template=")
            run_git(work, "add", "-A")
            run_git(work, "commit", "-q", "--no-verify", "-m", f"{profile.repo} source", date=FOLDER_DATE)
            src = str(work)
        part = Path(tmp) / "repo.git"
        run_git(Path(tmp), "clone", "-q", "--bare", "--no-hardlinks", src, str(part), timeout=900)
        run_git(part, "remote", "remove", "origin", check=False)
        res = run_git(part, "rev-parse", "--verify", "--quiet", f"{profile.commit}^{{commit}}", check=False)
        if res.returncode != 0:
            raise SmithError(f"commit {profile.commit!r} is not in the repository", file=src, field="commit")
        commit = res.stdout.strip()
        date = git_out(part, "show", "-s", "--format=%cI", commit).strip()
        subject = git_out(part, "show", "-s", "--format=%s", commit).strip()
        if bare.exists():
            shutil.rmtree(bare)
        os.replace(part, bare)
    return {"commit": commit, "date": date, "subject": subject}


def _is_bare(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "HEAD")) and os.path.isdir(os.path.join(path, "objects"))


# The environment template is built with the configured provider from that bare repository (local: a
# workspace; docker: a task image from the locally built base) or, for E2B, from the profile's prebuilt
# `image`.
def build_environment(
    provider: Provider,
    provider_name: str,
    profile: RepoProfile,
    bare: str | os.PathLike,
    commit: str,
    *,
    settings: SandboxSettings,
    wheel: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Build the environment template (repository at /testbed at `commit`); the template record.
    `settings`: the `sandbox` settings (the Docker base image, build attempts)."""
    from ..sandbox.build import build_template
    from ..sandbox.spec import TemplateSpec

    image = profile.env_image(commit)
    spec = TemplateSpec(image=image, runtime_wheel=Path(wheel) if wheel else None)
    source: dict[str, Any] = {}
    if provider_name == "local":
        source = {"repo": Path(bare).resolve(), "commit": commit}
    elif provider_name == "docker":
        if not profile.image:
            from ..sandbox.images import build_base_image, build_task_image

            base = build_base_image(settings.base_image)
            build_task_image(image, Path(bare).resolve(), commit, base=base)
    elif not profile.image:
        raise SmithError(
            f"the {provider_name} provider needs a prebuilt environment image",
            field="image",
            hint="set `image` in the repository profile",
        )
    rec = build_template(
        provider,
        image,
        spec=spec,
        attempts=settings.build_attempts,
        **source,
    )
    return {**rec.to_dict(), "ok": True}
