"""The validate stage (rules/validate.smk) as plain functions: per-task inputs, one task's verdict, the summary.

``write_task_inputs`` (checkpoint: one byte-stable file per task), ``validate_task_file`` (one task, in
fresh sandboxes), ``summarize`` (report + ``tasks.valid.jsonl``; broken tasks are listed with their reason,
never silently dropped; ``error`` tasks are retried next run).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import DatasetError, EmptyResultError, ProvenanceError
from ..grading.evaluate import EvalResult, eval_network, evaluate_patch, write_evidence
from ..grading.task_validation import ERROR_ATTEMPTS, ERROR_BACKOFF_S, UNGUARDED, VERDICTS, validate_task
from ..rulekit import check_not_empty, from_snakemake
from ..sandbox.base import Provider
from ..sandbox.registry import provider_from_config
from ..sandbox.settings import NetworkSettings, SandboxSettings
from ..schema import default
from ..util import atomic_write, atomic_write_json, read_json, stable_json, sync_item_files, write_if_changed

__all__ = [
    "from_snakemake",
    "summarize",
    "validate_task_file",
    "validate_task_step",
    "write_task_inputs",
    "write_valid_rows",
]

log = logging.getLogger("sweflow.validation")


# ----- checkpoint: per-task inputs ----------------------------------------------------------------------
def read_jsonl_rows(path: str | os.PathLike) -> list[tuple[str, str]]:
    """(instance_id, raw line) of every row of a training JSONL, in file order."""
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(keepends=True), 1):
        if not line.strip():
            continue
        try:
            iid = json.loads(line)["metadata"]["instance_id"]
        except (ValueError, KeyError, TypeError) as exc:
            raise DatasetError(f"bad training row: {exc}", file=str(path), row=n, field="metadata") from None
        out.append((iid, line if line.endswith("\n") else line + "\n"))
    return out


def gold_patches(parquet: str | os.PathLike, *, split: str, shape: str = "auto") -> dict[str, str]:
    """instance_id -> gold patch, read from the split parquet (the JSONL never carries it)."""
    from ..dataset.splits import load_split

    instances, _ = load_split(parquet, split=split, shape=shape)
    return {i["instance_id"]: i.get("patch") or "" for i in instances}


# ``write_task_inputs`` (a checkpoint) writes one byte-stable file per task = the JSONL row's metadata plus
# the gold patch from the split parquet.
def write_task_inputs(
    jsonl: str | os.PathLike,
    parquet: str | os.PathLike,
    out_dir: str | os.PathLike,
    listing: str | os.PathLike,
    *,
    split: str,
    shape: str = "auto",
) -> list[str]:
    """One ``<instance_id>.json`` per JSONL row ({instance_id, metadata, gold_patch}) and the id listing.

    Files are rewritten only when their bytes change and stale ones are removed, so a changed row
    re-validates one task. A JSONL row whose instance is absent from the parquet raises DatasetError.
    """
    rows = read_jsonl_rows(jsonl)
    gold = gold_patches(parquet, split=split, shape=shape)
    files = {}
    for iid, line in rows:
        if iid not in gold:
            raise DatasetError(
                "training row has no instance in the split parquet",
                file=str(parquet),
                row=iid,
                field="instance_id",
            )
        data = {"instance_id": iid, "metadata": json.loads(line)["metadata"], "gold_patch": gold[iid]}
        files[f"{iid}.json"] = stable_json(data)
    sync_item_files(out_dir, files, "*.json")
    ids = [iid for iid, _ in rows]
    atomic_write(listing, "".join(f"{i}\n" for i in ids))
    log.info("%d tasks to validate", len(ids))
    return ids


def write_valid_rows(
    valid: str | os.PathLike, out_dir: str | os.PathLike, listing: str | os.PathLike
) -> list[str]:
    """One ``<instance_id>.jsonl`` per row of ``tasks.valid.jsonl`` (the row's own line) and the id listing in
    file order (a checkpoint): the jobs downstream of validation (e2e check, SFT collection and grading) read
    their own tasks' files, so one changed verdict reruns only that task's work. Unchanged rows keep their
    bytes; rows no longer valid lose their file."""
    rows = read_jsonl_rows(valid)
    sync_item_files(out_dir, {f"{iid}.jsonl": line for iid, line in rows}, "*.jsonl")
    ids = [iid for iid, _ in rows]
    write_if_changed(listing, "".join(f"{i}\n" for i in ids))
    log.info("%d valid tasks, one row file each", len(ids))
    return ids


# ``validate_task_file`` validates one task, in fresh sandboxes: the verdicts are
# ``sweflow.grading.task_validation``'s; every evaluation's whole log and status map go gzip-compressed next
# to the verdict, ``sweflow.grading.evaluate.write_evidence``.
def validate_task_file(
    task_file: str | os.PathLike,
    out: str | os.PathLike,
    *,
    provider: Provider,
    repeats: int = default("validation.repeats"),
    parallel: int = 1,
    evidence_out: str | os.PathLike | None = None,
    network: NetworkSettings | None = None,
    error_attempts: int = ERROR_ATTEMPTS,
    error_backoff: float = ERROR_BACKOFF_S,
    evaluate: Callable[..., EvalResult] = evaluate_patch,
    decoys: int = default("validation.decoys"),
) -> dict[str, Any]:
    """Validate the task in ``task_file`` (written by write_task_inputs) and write its record atomically;
    ``evidence_out`` gets every evaluation's log and status map (``write_evidence``). ``network`` is
    the ``sandbox.network`` settings (None: offline)."""
    task = read_json(task_file)
    meta = task["metadata"]
    evidence: list[dict[str, Any]] = []
    rec = validate_task(
        provider,
        meta,
        task.get("gold_patch") or "",
        repeats=repeats,
        parallel=parallel,
        sandbox_timeout=float(meta.get("sandbox_timeout_sec") or 3600),
        error_attempts=error_attempts,
        error_backoff=error_backoff,
        network=eval_network(network, str(meta.get("repo") or "")),
        evidence=evidence,
        evaluate=evaluate,
        decoys=decoys,
    )
    if evidence_out is not None:
        write_evidence(evidence_out, evidence)
    atomic_write_json(out, rec)
    if rec["verdict"] == "error":
        log.error(
            "%s: could not be validated, an infrastructure failure (%s); not a verdict about the task: it "
            "is left out of tasks.valid.jsonl and the next run validates it again",
            rec["instance_id"],
            rec["reason"],
        )
    else:
        log.info(
            "%s: %s%s", rec["instance_id"], rec["verdict"], f" ({rec['reason']})" if rec["reason"] else ""
        )
    return rec


def validate_task_step(
    task_file: str | os.PathLike,
    out: str | os.PathLike,
    *,
    provider: str,
    cfg: Mapping[str, Any],
    validation: Mapping[str, Any],
    parallel: int = 1,
    evidence_out: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """``validate_task_file`` with the provider for fresh evaluations made from the ``sandbox`` config section
    ``cfg``; ``validation`` is the ``validation`` config section (repeats, error_attempts, error_backoff_sec)."""
    settings = SandboxSettings.from_config(cfg)
    return validate_task_file(
        task_file,
        out,
        provider=provider_from_config(provider, settings, purpose="eval"),
        repeats=validation["repeats"],
        parallel=parallel,
        evidence_out=evidence_out,
        network=settings.network,
        error_attempts=validation.get("error_attempts", ERROR_ATTEMPTS),
        error_backoff=validation.get("error_backoff_sec", ERROR_BACKOFF_S),
        decoys=validation.get("decoys", default("validation.decoys")),
    )


# ----- summary ------------------------------------------------------------------------------------------
def summarize(
    jsonl: str | os.PathLike,
    results: Iterable[str | os.PathLike],
    summary_out: str | os.PathLike,
    valid_out: str | os.PathLike,
    *,
    dataset: str = "",
    split: str = "",
    reopen_errors: bool = False,
    allow_empty: bool | Sequence[str] = default("allow_empty"),
    allow_unguarded: bool = default("validation.allow_unguarded"),
) -> dict[str, Any]:
    """Write the summary report and ``tasks.valid.jsonl`` (the JSONL's own lines, in order, valid ones only).

    Every JSONL task appears in the summary: valid, under ``unguarded`` (gold passed but its runs carried
    no canary: kept only with ``allow_unguarded``, the config key; ``unguarded_kept`` says which), under
    ``broken`` (a verdict about the task) or under ``errors`` (verdict ``error``: the infrastructure failed,
    nothing is known about the task; a task with no result file is one too, reason ``no validation
    result``). With ``reopen_errors`` (the rule) each
    error task's result file and its provenance record are removed once the summary is written; after the
    run, ``reopen_summaries`` dates such a summary back, so the next run re-runs it, which first
    re-validates the removed tasks (and only those). No task valid raises EmptyResultError naming the
    most common verdict and reason (nothing is written; error tasks are reopened all the same) unless
    `allow_empty` (the config key) names validation_summary.
    """
    by_id: dict[str, dict[str, Any]] = {}
    paths: dict[str, Path] = {}
    for path in results:
        rec = read_json(path)
        by_id[rec["instance_id"]] = rec
        paths[rec["instance_id"]] = Path(path)
    rows = read_jsonl_rows(jsonl)
    verdicts: Counter[str] = Counter()
    broken, errors, kept, unguarded, twinless = [], [], [], [], []
    for iid, line in rows:
        rec = by_id.get(iid)
        verdict = rec["verdict"] if rec else "error"
        reason = rec.get("reason") if rec else "no validation result"
        verdicts[verdict] += 1
        if verdict == "valid":
            kept.append(line)
            gold = [r for r in rec.get("runs") or [] if r.get("patch") == "gold"]
            if gold and not any(r.get("f2p_twins") for r in gold):
                twinless.append(iid)
        elif verdict == UNGUARDED:
            unguarded.append({"instance_id": iid, "verdict": verdict, "reason": reason})
            if allow_unguarded:
                kept.append(line)
        elif verdict == "error":
            errors.append({"instance_id": iid, "verdict": verdict, "reason": reason})
        else:
            broken.append({"instance_id": iid, "verdict": verdict, "reason": reason})
    summary = {
        "dataset": dataset,
        "split": split,
        "tasks": len(rows),
        "valid": len(kept),
        "verdicts": {v: verdicts.get(v, 0) for v in VERDICTS},
        "unguarded": unguarded,
        "unguarded_kept": bool(allow_unguarded),
        # valid tasks whose FAIL_TO_PASS tests got no twin (parametrized, no literal expectation): guarded
        # against forged reports and blanket no-ops, not against a forger that no-ops only the new tests
        # lacking a near-copy (docs/trust.md)
        "without_f2p_twins": twinless,
        "broken": broken,
        "errors": errors,
    }
    if not kept:
        for b in unguarded + broken + errors:
            log.warning("%s: %s (%s)", b["instance_id"], b["verdict"], b["reason"])
        try:
            check_not_empty(
                "validation_summary",
                kept=0,
                total=len(rows),
                what=f"tasks of split {split} valid" if split else "tasks valid",
                reasons=[
                    ("", f"{t['verdict']}: {t['reason']}" if t["reason"] else t["verdict"])
                    for t in unguarded + broken + errors
                ],
                allow_empty=allow_empty,
            )
        except EmptyResultError:  # the error tasks are validated again all the same
            if reopen_errors:
                _reopen(errors, paths)
            raise
    atomic_write(valid_out, "".join(kept))
    atomic_write_json(summary_out, summary)
    log.info(
        "validation: %d/%d tasks valid; %d broken (left out): %s",
        len(kept),
        len(rows),
        len(broken),
        [f"{b['instance_id']} ({b['verdict']})" for b in broken],
    )
    if unguarded:
        log.warning(
            "validation: %d tasks unguarded (no canary could be planted; %s): %s",
            len(unguarded),
            "kept: validation.allow_unguarded is on" if allow_unguarded else "left out of tasks.valid.jsonl",
            ", ".join(u["instance_id"] for u in unguarded),
        )
    if errors:
        log.error(
            "validation: %d tasks could NOT be validated (infrastructure failures, not verdicts about the "
            "tasks; left out of tasks.valid.jsonl this time, the next run retries them): %s",
            len(errors),
            "; ".join(f"{e['instance_id']}: {e['reason']}" for e in errors),
        )
        if reopen_errors:
            _reopen(errors, paths)
    return summary


def _reopen(errors: list[dict[str, Any]], paths: Mapping[str, Path]) -> None:
    """Remove each error task's result file and its provenance record: the next run validates it again."""
    from ..provenance.records import record_path

    for e in errors:
        result = paths.get(e["instance_id"])
        if result is None:
            continue
        result.unlink(missing_ok=True)
        try:
            record_path(result).unlink(missing_ok=True)
        except ProvenanceError:  # a result outside the provenance root has no record
            pass


def reopen_summaries(summaries: Iterable[str | os.PathLike]) -> list[str]:
    """Date back (mtime 1) every validation summary that lists ``errors``, with its ``tasks.valid.jsonl``.

    Called by the workflow once the run is over (Snakemake re-dates a job's outputs after the job, and it
    ignores a missing intermediate file, here the removed error result, while its consumers are up to
    date): the next run then re-runs those summaries, and so first re-validates their error tasks.
    Returns the summaries reopened."""
    reopened = []
    for path in summaries:
        summary = Path(path)
        try:
            errors = read_json(summary).get("errors") or []
        except (OSError, ValueError):
            continue
        if not errors:
            continue
        for out in (summary, summary.with_name("tasks.valid.jsonl")):
            if out.exists():
                os.utime(out, (1, 1))
        reopened.append(str(summary))
        log.warning("%s: %d tasks to validate again on the next run", summary, len(errors))
    return reopened
