"""The data stage (rules/data.smk) as plain functions: each reads its input files and atomically writes its
outputs. The workflow's `scripts/` call these; tests call them directly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..dataset.hub_client import copy_offline, download_file, hub_endpoint_env, is_sha, resolve_revision
from ..dataset.image_names import ImageNaming, group_by_image
from ..dataset.splits import apply_limit, load_split
from ..errors import ConfigError, DatasetError
from ..rulekit import check_not_empty, from_snakemake
from ..schema import default, defaults
from ..util import (
    atomic_write,
    atomic_write_json,
    atomic_write_lines,
    environ,
    read_json,
    redact,
    write_folder,
    write_if_changed,
)

__all__ = [
    "convert",
    "convert_options",
    "download_split",
    "from_snakemake",
    "harness_from_config",
    "list_images",
    "resolve_dataset",
    "template_map",
    "validate_split",
]

log = logging.getLogger("sweflow.stages")


@contextlib.contextmanager
def hub_endpoint(
    endpoint: str | None,
    *,
    store_root: str | os.PathLike = "resources/hub",
    models: Sequence[str] = (),
    write_token: str | None = None,
) -> Iterator[str | None]:
    """Yield the Hub endpoint URL to use. "local" starts the bundled endpoint over `store_root` (publishing the
    embedded sample into it first, and each of `models` that is one of the bundled tiny models; writes with
    `write_token` only); a URL or None is passed through."""
    if endpoint != "local":
        yield endpoint
        return
    from ..offline import local_hub

    local_hub.publish_sample(store_root)
    for repo_id in models:
        if repo_id in local_hub.TINY_MODEL_REPOS:
            local_hub.publish_tiny_model(store_root, repo_id=repo_id)
    with local_hub.serve(local_hub.HubStore(store_root), write_token=write_token) as url:
        yield url


def resolve_dataset(
    out: str | os.PathLike,
    *,
    repo_id: str,
    revision: str,
    endpoint: str | None,
    offline_dir: str | None = None,
    repo_type: str = default("dataset.repo_type"),
    timeout: float = 60,
) -> dict[str, Any]:
    """Write {repo_id, repo_type, requested revision, commit sha, source} as byte-stable JSON."""
    if offline_dir:
        from ..util import sha256_tree

        sha = revision if is_sha(revision) else "offline-" + sha256_tree(offline_dir)[:32]
        source = "offline"
    else:
        with hub_endpoint(endpoint) as url, environ(hub_endpoint_env(url)):
            sha = resolve_revision(repo_id, revision, endpoint=url, repo_type=repo_type, timeout=timeout)
        source = "local-hub" if endpoint == "local" else (redact(endpoint) if endpoint else "huggingface.co")
    rec = {"repo_id": repo_id, "repo_type": repo_type, "revision": revision, "sha": sha, "source": source}
    write_if_changed(out, json.dumps(rec, sort_keys=True, indent=2) + "\n")
    log.info("%s@%s -> %s", repo_id, revision, sha)
    return rec


def download_split(
    out: str | os.PathLike,
    *,
    revision_file: str | os.PathLike,
    filename: str,
    endpoint: str | None,
    offline_dir: str | None = None,
    attempts: int = default("dataset.hub.download_attempts"),
    timeout: float = 60,
    cache_dir: str | os.PathLike | None = None,
) -> Path:
    """Download one split file at the resolved sha (or copy it from the offline folder)."""
    rev = read_json(revision_file)
    if offline_dir:
        return copy_offline(offline_dir, filename, out)
    with hub_endpoint(endpoint) as url, environ(hub_endpoint_env(url)):
        path = download_file(
            rev["repo_id"],
            filename,
            rev["sha"],
            out,
            endpoint=url,
            repo_type=rev["repo_type"],
            attempts=attempts,
            timeout=timeout,
            cache_dir=cache_dir,
        )
    log.info(
        "downloaded %s/%s@%s -> %s (%d bytes)",
        rev["repo_id"],
        filename,
        rev["sha"][:12],
        out,
        path.stat().st_size,
    )
    return path


def validate_split(
    parquet: str | os.PathLike,
    report_out: str | os.PathLike,
    *,
    split: str,
    expected_rows: int | None,
    shape: str = "auto",
    max_problem_statement_chars: int | None = None,
) -> dict[str, Any]:
    """Validate the whole split (row count, schema, types, UTF-8, statement size, duplicates) and write the
    report; any bad row fails it with one error listing every bad row, and no report is written."""
    instances, report = load_split(
        parquet,
        split=split,
        shape=shape,
        expected_rows=expected_rows,
        max_problem_statement_chars=max_problem_statement_chars,
    )
    data = report.to_dict()
    atomic_write_json(report_out, data)
    log.info(
        "split %s: %d rows valid (%s)",
        split,
        report.rows,
        ", ".join(f"{k}={v}" for k, v in report.repos.items()),
    )
    return data


def load_validated(
    parquets: Mapping[str, str],
    *,
    shape: str,
    limit: int | None,
    expected: Mapping[str, int | None] | None = None,
    max_problem_statement_chars: int | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Each split's instances (whole split validated, then the limit applied)."""
    out = {}
    for split, path in parquets.items():
        inst, _ = load_split(
            path,
            split=split,
            shape=shape,
            expected_rows=(expected or {}).get(split),
            max_problem_statement_chars=max_problem_statement_chars,
        )
        out[split] = apply_limit(inst, limit)
    return out


def list_images(
    images_dir: str | os.PathLike,
    listing_out: str | os.PathLike,
    *,
    parquets: Mapping[str, str],
    naming: ImageNaming | Mapping[str, Any],
    shape: str = "auto",
    limit: int | None = None,
    max_problem_statement_chars: int | None = None,
) -> list[str]:
    """One byte-stable JSON per image under images_dir + the ordered list.

    The folder is written whole (a temp folder renamed into place: never half-written) without an fsync per
    record, which at SWE-Gym scale cost more than the rest of the step. Snakemake removes a checkpoint's
    output folder before the job, so unchanged records are new files with the same bytes (their checksums,
    not their mtimes, keep their dependents from re-running). `naming` is an ImageNaming or the `naming`
    config section it is made from."""
    if not isinstance(naming, ImageNaming):
        naming = ImageNaming.from_config(dict(naming))
    splits = load_validated(
        parquets, shape=shape, limit=limit, max_problem_statement_chars=max_problem_statement_chars
    )
    groups: dict[str, dict[str, Any]] = {}
    for split, instances in splits.items():
        for image, rec in group_by_image(instances, naming).items():
            g = groups.setdefault(image, {**rec, "instances": []})
            g["instances"].extend({**i, "split": split} for i in rec["instances"])
    write_folder(
        images_dir,
        {f"{rec['key']}.json": json.dumps(rec, sort_keys=True, indent=2) + "\n" for rec in groups.values()},
    )
    images = list(groups)
    atomic_write(listing_out, "".join(f"{img}\n" for img in images))
    log.info("%d distinct images", len(images))
    return images


def template_map(
    records: list[str],
    map_out: str | os.PathLike,
    failures_out: str | os.PathLike,
    *,
    prebuilt: bool = default("sandbox.prebuilt"),
    allow_empty: bool | Sequence[str] = default("allow_empty"),
    listing: str | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """Aggregate per-image build records into {image: template} and {image: failure reason}. `prebuilt`:
    `records` is list_images' listing and every image is its own template (no build record per image).
    No template at all raises EmptyResultError naming the most common failure (and nothing is written),
    unless `allow_empty` (the config key) names template_map; `listing` (images.txt) goes into its hint."""
    mapping, failures = {}, {}
    if prebuilt:
        for listing in records:
            lines = Path(listing).read_text(encoding="utf-8").splitlines()
            mapping.update((img.strip(), img.strip()) for img in lines if img.strip())
        records = []
    for path in records:
        rec = read_json(path)
        image = rec.get("image")
        if not image:
            raise DatasetError("build record has no image", file=str(path), field="image")
        if rec.get("ok", True) and rec.get("template"):
            mapping[image] = rec["template"]
        else:
            failures[image] = f"{rec.get('step', 'build')}: {rec.get('error', 'unknown error')}"
    for image, reason in sorted(failures.items()):
        log.warning("no template for %s: %s", image, reason)
    check_not_empty(
        "template_map",
        kept=len(mapping),
        total=len(mapping) + len(failures),
        what="images have a template",
        reasons=sorted(failures.items()),
        allow_empty=allow_empty,
        listing=listing,
    )
    atomic_write_json(map_out, dict(sorted(mapping.items())))
    atomic_write_json(failures_out, dict(sorted(failures.items())))
    log.info("template map: %d templates, %d failed builds", len(mapping), len(failures))
    return mapping, failures


def harness_from_config(package: str, extra_repos: Any, extra_parsers: Mapping[str, str] | None = None):
    """Load the harness package and merge the configured extra repo specs into its tables."""
    from ..harness import load_harness

    harness = load_harness(package)
    specs: dict[str, Any] = {}
    parsers: dict[str, str] = dict(extra_parsers or {})
    if extra_repos == "sample":
        from ..sample import HARNESS_PARSERS, HARNESS_SPECS

        specs.update(HARNESS_SPECS)
        parsers = {**HARNESS_PARSERS, **parsers}
    elif isinstance(extra_repos, dict):
        specs.update(extra_repos)
    elif extra_repos not in (None, ""):
        raise ConfigError(f"unknown value {extra_repos!r}", field="harness.extra_repos")
    if specs:
        harness.register_repos(specs, parsers)
    return harness


def convert(
    parquet: str | os.PathLike,
    map_file: str | os.PathLike,
    failures_file: str | os.PathLike,
    out: str | os.PathLike,
    report_out: str | os.PathLike,
    *,
    opts: Any,
    harness: Any,
    shape: str = "auto",
    limit: int | None = None,
    max_problem_statement_chars: int | None = None,
    workers: int = 1,
    allow_empty: bool | Sequence[str] = default("allow_empty"),
    listing: str | None = None,
) -> dict[str, Any]:
    """Convert one split to the training JSONL (atomic, byte-identical on rerun) and write a report listing
    each skipped row (file, row, field, reason: a failed template build or a row the harness cannot handle).
    `workers`: processes converting runs of rows (the same bytes with any number). No row converted raises
    EmptyResultError naming the most common reason (nothing is written) unless `allow_empty` names convert;
    `listing` (images.txt) goes into its hint."""
    from ..dataset.convert import convert_split

    instances, _ = load_split(
        parquet, split=opts.split, shape=shape, max_problem_statement_chars=max_problem_statement_chars
    )
    instances = apply_limit(instances, limit)
    result = convert_split(
        instances,
        template_map=read_json(map_file),
        failed_images=read_json(failures_file),
        harness=harness,
        opts=opts,
        source_file=str(parquet),
        workers=workers,
    )
    total = len(instances)
    del instances  # the rows are in the lines now: not held while they are written
    for s in result.skipped:
        log.warning("skipped %s: row %s: field %r: %s", s["file"], s["row"], s["field"], s["reason"])
    check_not_empty(
        "convert",
        kept=len(result.lines),
        total=total,
        what=f"rows of split {opts.split} converted",
        reasons=[(s.get("image") or "", s["reason"]) for s in result.skipped],
        allow_empty=allow_empty,
        listing=listing,
    )
    atomic_write_lines(out, result.lines)
    report = {"split": opts.split, "rows": len(result.lines), "skipped": result.skipped}
    atomic_write_json(report_out, report)
    log.info("converted %d rows, %d skipped", len(result.lines), len(result.skipped))
    return report


def harness_info(package: str) -> dict[str, Any]:
    """The harness package and its installed version (recorded in every training row)."""
    from importlib import metadata

    try:
        version = metadata.version(package)
    except metadata.PackageNotFoundError:
        version = None
    return {"package": package, "version": version}


def convert_options(
    *,
    dataset: str,
    split: str,
    provider: str,
    harness_cfg: Mapping[str, Any],
    agent_cfg: Mapping[str, Any],
    naming_cfg: Mapping[str, Any],
    sandbox_timeout_sec: int,
    harness: Any,
):
    """ConvertOptions from the validated config sections."""
    from ..dataset.convert import ConvertOptions

    # the rows carry the backend options as configured (a validated config has them all)
    backend = dict(agent_cfg.get("backend_options") or {})
    agent_cfg, harness_cfg = defaults("agent", agent_cfg), defaults("harness", harness_cfg)
    return ConvertOptions(
        dataset=dataset,
        split=split,
        provider=provider,
        blackbox_type=agent_cfg["blackbox_type"],
        agent_mode=agent_cfg["agent_mode"],
        workdir=agent_cfg["backend_options"]["working_directory"],
        sandbox_timeout_sec=sandbox_timeout_sec,
        sanitizer_timeout_sec=harness_cfg["sanitizer_timeout_sec"],
        after_agent_timeout_sec=harness_cfg["after_agent_timeout_sec"],
        eval_timeout_sec=harness_cfg["eval_timeout_sec"],
        reward_function=harness_cfg["reward_function"],
        reward_marker=harness_cfg["reward_marker"],
        backend_options=backend,
        naming=ImageNaming.from_config(dict(naming_cfg)),
        harness_info=harness_info(harness_cfg["package"]),
    )
