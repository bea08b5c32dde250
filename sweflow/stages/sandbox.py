"""The sandbox stage (rules/sandbox.smk) as plain functions: artifacts, one template per image, smoke markers,
summary."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import SandboxError
from ..rulekit import from_snakemake
from ..sandbox.registry import provider_from_config
from ..sandbox.settings import SandboxSettings
from ..util import atomic_write_json, read_json

__all__ = [
    "build_template_step",
    "claude_code_artifact",
    "from_snakemake",
    "runtime_wheel",
    "smoke_step",
    "smoke_summary",
]

log = logging.getLogger("sweflow.stages")


def claude_code_artifact(out: str | os.PathLike, *, version: str) -> dict[str, Any]:
    """Fetch the pinned Claude Code binary (npm platform package) next to `out`; write its checksum record."""
    from ..sandbox.artifacts import fetch_claude

    folder = Path(out).parent
    folder.mkdir(parents=True, exist_ok=True)
    cached = read_json(out) if Path(out).exists() else None
    info = fetch_claude(folder, version, cached=cached)
    atomic_write_json(out, info)
    log.info("claude %s: sha256 %s (%d bytes)", version, info["sha256"], info["size"])
    return info


def runtime_wheel(out: str | os.PathLike) -> dict[str, Any]:
    """Build the sweflow wheel for the in-sandbox runtime (reproducible) next to `out`; write its record."""
    from ..sandbox.artifacts import build_wheel

    folder = Path(out).parent
    folder.mkdir(parents=True, exist_ok=True)
    info = build_wheel(folder)
    atomic_write_json(out, info)
    log.info("runtime wheel %s: sha256 %s", info["path"], info["sha256"])
    return info


def _artifact_path(record_file: str | os.PathLike) -> Path:
    rec = read_json(record_file)
    return (Path(record_file).parent / rec["path"]).resolve()


def build_template_step(
    image_file: str | os.PathLike,
    out: str | os.PathLike,
    *,
    provider: str,
    cfg: Mapping[str, Any],
    claude_record: str | os.PathLike | None = None,
    wheel_record: str | os.PathLike | None = None,
    task_repos: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Build (or reuse) the template of one task image and write its record; a failed build writes a failure
    record (ok: false, step, error) instead of raising, so one broken image never stops the others.
    `task_repos` (repo -> local bare repository of synthesized task states, from gather_tasks): the
    image's repository comes from there instead of a registry. `cfg`: the `sandbox` config section."""
    settings = SandboxSettings.from_config(cfg)
    rec = read_json(image_file)
    image = rec["image"]
    if settings.prebuilt:
        data = {"image": image, "provider": provider, "template": image, "ok": True, "build": "prebuilt"}
        atomic_write_json(out, data)
        return data
    from ..sandbox.build import build_and_record, write_build_record
    from ..sandbox.spec import TemplateSpec

    spec = TemplateSpec(
        image=image,
        packages=settings.packages,
        claude_binary=_artifact_path(claude_record),
        runtime_wheel=_artifact_path(wheel_record),
        cpu=settings.e2b.cpu_count,
        memory_mb=settings.e2b.memory_mb,
    )
    with tempfile.TemporaryDirectory(prefix="sweflow-src-") as tmp:
        try:
            source = _template_source(rec, provider, settings, Path(tmp), task_repos or {})
        except SandboxError as exc:
            return write_build_record(out, image=image, provider=provider, step="task_image", error=str(exc))
        prov = provider_from_config(provider, settings, purpose="build")
        data = build_and_record(
            prov,
            image,
            out,
            spec=spec,
            attempts=settings.build_attempts,
            **source,
        )
    log.info(
        "template for %s: %s", image, data.get("template") if data.get("ok") else f"FAILED {data.get('step')}"
    )
    return data


def _template_source(
    rec: dict[str, Any],
    provider: str,
    settings: SandboxSettings,
    tmp: Path,
    task_repos: Mapping[str, str],
) -> dict[str, Any]:
    """Where a template's repository comes from. Task images from a registry carry it at /testbed; the
    embedded sample's images are built here from the sample repository, and synthesized tasks' images from
    a repository holding only their own task commit (no registry needed)."""
    from ..sample import REPO_NAME, materialize_repo

    commit = rec["instances"][0]["base_commit"]
    if rec["repo"] in task_repos:
        from ..smith.gather import task_repository

        repo, commit = task_repository(
            task_repos[rec["repo"]], rec["instances"][0]["instance_id"], tmp / "task"
        )
    elif rec["repo"] == REPO_NAME:
        repo = materialize_repo(tmp / "calclib").path
    else:
        return {}
    if provider == "local":
        return {"repo": repo, "commit": commit}
    if provider == "docker":
        from ..sandbox.images import build_base_image, build_task_image

        base = build_base_image(settings.base_image)
        # a synthesized task's image name stays when its state changes (the tests it hides): rebuild it
        build_task_image(rec["image"], repo, commit, base=base, force=rec["repo"] in task_repos)
    return {}


def smoke_step(
    record_file: str | os.PathLike, out: str | os.PathLike, *, provider: str, cfg: Mapping[str, Any]
) -> dict[str, Any]:
    """Smoke-test one built template (health and status from inside and through the port URL); always writes
    a marker, with ok: false and the failing step when the build or the smoke test failed. With prebuilt
    images the record is the image's own (list_images) and the image is the template. `cfg`: the `sandbox`
    config section."""
    from ..sandbox.smoke import smoke

    settings = SandboxSettings.from_config(cfg)
    rec = read_json(record_file)
    if settings.prebuilt:
        rec = {"image": rec["image"], "template": rec["image"], "ok": True}
    base = {"image": rec["image"], "provider": provider, "template": rec.get("template")}
    if not rec.get("ok"):
        data = {**base, "ok": False, "step": "build", "error": rec.get("error", "template build failed")}
    else:
        try:
            data = {**base, **smoke(provider_from_config(provider, settings), rec["template"])}
        except SandboxError as exc:
            data = {**base, "ok": False, "step": exc.field or "smoke", "error": exc.one_line()}
    atomic_write_json(out, data)
    log.info("smoke %s: %s", base["template"], "ok" if data.get("ok") else f"FAILED {data.get('error')}")
    return data


def smoke_summary(markers: list[str], out: str | os.PathLike) -> dict[str, Any]:
    """Per-item report of every template's smoke marker (failures listed with their step and error)."""
    items = [read_json(m) for m in markers]
    failed = [
        {"image": i.get("image"), "step": i.get("step"), "error": i.get("error")}
        for i in items
        if not i.get("ok")
    ]
    data = {
        "templates": len(items),
        "ok": len(items) - len(failed),
        "failed": sorted(failed, key=lambda d: d["image"] or ""),
    }
    atomic_write_json(out, data)
    return data
