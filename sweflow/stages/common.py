"""What `rules/common.smk` and the Snakefile call: checkpoint listings, the runtime source hash, the run
manifest and the leftovers of killed runs. Imported at workflow parse time, so every function is cheap and
imports its domain module only when called."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..dataset.image_names import image_key
from ..smith.candidates import FIRST_STRATEGIES as SMITH_FIRST_STRATEGIES  # noqa: F401 - for rules/smith.smk
from ..train.preempt import grpo_retries, slurm_signal_option  # noqa: F401 - for rules/train.smk


def image_keys_from_listing(listing: str | os.PathLike) -> list[str]:
    """The per-image keys of a list_images listing (one image name per line)."""
    return [image_key(line.strip()) for line in Path(listing).read_text().splitlines() if line.strip()]


def listed_ids(listing: str | os.PathLike) -> list[str]:
    """The instance ids of a validation_tasks listing (one per line)."""
    return [x.strip() for x in Path(listing).read_text().splitlines() if x.strip()]


def shard_ids(ids: Sequence[str], shard: int, shards: int, limit: int | None) -> list[str]:
    """The instance ids of one shard (a stable hash of the id: the same task is always in the same shard,
    whatever the other ids) among the first `limit` ids, in their order."""
    from ..smith.candidates import shard_of

    picked = list(ids)[:limit] if limit is not None else list(ids)
    return [i for i in picked if shard_of(i, shards) == shard]


def model_dir_name(repo_id: str) -> str:
    """The folder under models/ of a Hub model repo: its id with / as -- (Qwen/Qwen3.5-4B -> Qwen--Qwen3.5-4B)."""
    return repo_id.replace("/", "--")


def runtime_source_hash(basedir: str | os.PathLike) -> str:
    """Hash of the sweflow sources that go into the in-sandbox runtime wheel (`sweflow.sandbox.artifacts`)."""
    from ..sandbox.artifacts import source_hash

    return source_hash(Path(basedir))


def write_run_manifest(path: str | os.PathLike, root: str | os.PathLike = ".") -> None:
    """The run manifest of every recorded artifact (`sweflow.provenance.write_manifest`)."""
    from ..provenance import write_manifest

    write_manifest(path, root=root)


def end_of_run() -> None:
    """What onsuccess/onerror do last: no exit delay from the scheduler's timers (`sweflow.rulekit`)."""
    from ..rulekit import cancel_scheduler_timers

    cancel_scheduler_timers()


def reap_leftovers() -> None:
    """Remove the sandboxes and build folders of earlier, killed runs (`sweflow.sandbox.ledger`)."""
    from ..sandbox.ledger import reap_on_start

    reap_on_start()


def reopen_error_summaries(summaries: list[str]) -> list[str]:
    """Validation summaries with `error` tasks re-run next time (`sweflow.stages.validate.reopen_summaries`)."""
    from .validate import reopen_summaries

    return reopen_summaries(summaries)


def profile_entries(repos: Sequence[Any], base: str | os.PathLike = ".") -> dict[str, Any]:
    """name -> profile for the configured `smith.repos` (names must be unique)."""
    from ..errors import SmithError
    from ..smith.profile import load_profile

    out: dict[str, Any] = {}
    for entry in repos:
        prof = load_profile(entry, base=base)
        if prof.name in out:
            raise SmithError(f"two repository profiles are named {prof.name!r}", field="smith.repos")
        if any(p.repo == prof.repo for p in out.values()):
            # task states and harness specs are kept per repository: one profile each
            raise SmithError(f"two repository profiles are for {prof.repo!r}", field="smith.repos")
        out[prof.name] = prof
    return out


def smith_harness(harness: Mapping[str, Any], profiles: Iterable[Any]) -> dict[str, Any]:
    """The `harness` config section for the synthesized dataset: the configured one, plus each profile's
    spec and parser for a repository it does not know (the sample's repository is known as "sample")."""
    from ..sample import HARNESS_SPECS

    extra = harness.get("extra_repos")
    known = set(HARNESS_SPECS) if extra == "sample" else set(extra or {})
    new = [p for p in profiles if p.repo not in known]
    if not new:
        return dict(harness)
    specs: dict[str, Any] = dict(HARNESS_SPECS) if extra == "sample" else dict(extra or {})
    parsers = dict(harness.get("extra_parsers") or {})
    if extra == "sample":
        from ..sample import HARNESS_PARSERS

        parsers = {**HARNESS_PARSERS, **parsers}
    for p in new:
        specs.update(p.harness_spec())
        parsers[p.repo] = p.log_parser
    return {**harness, "extra_repos": specs, "extra_parsers": parsers}
