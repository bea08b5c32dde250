"""The validate_tasks stage: every training task must be solvable by its gold patch and not by doing nothing.

Per task, in fresh sandboxes exactly as a rollout is graded (``sweflow.evaluate``): the gold patch must
resolve, the empty patch must not, each ``repeats`` times so flaky tests show up. Verdicts:

- ``valid``: gold resolved every time, empty never;
- ``gold_fails``: gold never resolved (or is not a gradable patch: it edits tests, or is empty);
- ``empty_passes``: the unchanged repository already resolves every time;
- ``flaky``: gold or empty got different outcomes across repeats;
- ``error``: the infrastructure failed (a provider fault, a dead or killed sandbox, the provider's
  deadline, an eval script that never reached the tests; see ``sweflow.evaluate``) on every one of
  ``error_attempts`` tries of some run, so nothing can be concluded about the task.

An infrastructure failure is retried (``validation.error_attempts``, exponential backoff from
``validation.error_backoff_sec``); it is never a verdict about the task. An ``error`` task is reported
under ``errors`` in the summary (not under ``broken``), kept out of ``tasks.valid.jsonl``, and is not
final: ``summarize`` removes its result (and record), so the next run validates it again.
The test command timing out inside a live sandbox (``eval_timeout``) is a run outcome like any failing
test: gold timing out every time is ``gold_fails``, sometimes ``flaky``.

Every evaluation (retries included) leaves its evidence: the whole host-side log and the parsed status
map, gzip-compressed JSON lines next to the verdict (``sweflow.evaluate.write_evidence``).

Stage files: ``write_task_inputs`` (checkpoint: one byte-stable file per task = the JSONL row's metadata
plus the gold patch from the split parquet), ``validate_task_file`` (one task), ``summarize`` (report +
``tasks.valid.jsonl``; broken tasks are listed with their reason, never silently dropped).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .errors import DatasetError, ProvenanceError
from .evaluate import (
    INFRA_REASONS,
    EvalResult,
    check_patch,
    eval_network,
    evaluate_patch,
    evidence_record,
    write_evidence,
)
from .sandbox.base import Provider
from .util import atomic_write, atomic_write_json, read_json, stable_json, write_if_changed

log = logging.getLogger("sweflow.validation")

VERDICTS = ("valid", "gold_fails", "empty_passes", "flaky", "error")
ERROR_ATTEMPTS = 3
ERROR_BACKOFF_S = 5.0
_MARKER_KEYS = (
    "fail_to_pass_success",
    "fail_to_pass_total",
    "pass_to_pass_success",
    "pass_to_pass_total",
    "parsed_tests",
    "test_exit_code",
    "eval_returncode",
    "failed_tests",
    "failure_detail",
)


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
    from .datasets import load_split

    instances, _ = load_split(parquet, split=split, shape=shape)
    return {i["instance_id"]: i.get("patch") or "" for i in instances}


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
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    keep = set()
    for iid, line in rows:
        if iid not in gold:
            raise DatasetError(
                "training row has no instance in the split parquet",
                file=str(parquet),
                row=iid,
                field="instance_id",
            )
        data = {"instance_id": iid, "metadata": json.loads(line)["metadata"], "gold_patch": gold[iid]}
        write_if_changed(out / f"{iid}.json", stable_json(data))
        keep.add(f"{iid}.json")
    for stale in out.glob("*.json"):
        if stale.name not in keep:
            stale.unlink()
    ids = [iid for iid, _ in rows]
    atomic_write(listing, "".join(f"{i}\n" for i in ids))
    log.info("%d tasks to validate", len(ids))
    return ids


def listed_ids(listing: str | os.PathLike) -> list[str]:
    return [x.strip() for x in Path(listing).read_text().splitlines() if x.strip()]


# ----- one task -----------------------------------------------------------------------------------------
def run_record(kind: str, index: int, res: EvalResult, infra_errors: list | None = None) -> dict[str, Any]:
    """The per-run entry of a task's validation file (marker counts, not the log tail); ``infra_errors``
    are the failed tries before this outcome ("reason: error" each)."""
    marker = res.marker or {}
    return {
        "patch": kind,
        "run": index,
        "attempts": len(infra_errors or []) + 1,
        "infra_errors": list(infra_errors or []),
        "resolved": res.resolved,
        "reward": res.reward,
        "failure_reason": res.failure_reason,
        "error": res.error,
        "marker": {k: marker[k] for k in _MARKER_KEYS if k in marker},
        "timings": dict(res.timings),
        "output_tail": res.output_tail[-1500:] if not res.resolved and res.output_tail else "",
    }


def decide(
    gold: list[dict[str, Any]], empty: list[dict[str, Any]], pre_reason: str | None = None
) -> tuple[str, str | None]:
    """(verdict, reason) from the gold and empty run records (see the module docstring)."""
    if pre_reason:
        return "gold_fails", pre_reason
    infra = [r for r in gold + empty if r["failure_reason"] in INFRA_REASONS]
    if infra:
        r = infra[0]
        tries = r.get("attempts", 1)
        where = f"{r['patch']} run {r['run']}" + (f", {tries} tries" if tries > 1 else "")
        return "error", f"{r['failure_reason']} ({where}): {r.get('error') or ''}".strip()
    g = sum(r["resolved"] for r in gold)
    e = sum(r["resolved"] for r in empty)
    if 0 < g < len(gold):
        return "flaky", f"gold resolved {g}/{len(gold)} runs: {_reasons(gold)}"
    if g == 0:
        return "gold_fails", _reasons(gold)
    if 0 < e < len(empty):
        return "flaky", f"empty patch resolved {e}/{len(empty)} runs"
    if empty and e == len(empty):
        return "empty_passes", f"empty patch resolved {e}/{len(empty)} runs"
    return "valid", None


def _reasons(runs: list[dict[str, Any]]) -> str:
    """Reason codes with counts, then the first failed run's detail (every failing test counted)."""
    failed = [r for r in runs if not r["resolved"]]
    counts = Counter(r["failure_reason"] for r in failed)
    codes = ", ".join(f"{k}" if n == 1 else f"{k} x{n}" for k, n in sorted(counts.items()))
    detail = next(
        (r["marker"]["failure_detail"] for r in failed if (r.get("marker") or {}).get("failure_detail")), None
    )
    return f"{codes} — {detail}" if detail else codes


def validate_task(
    provider: Provider,
    metadata: Mapping[str, Any],
    gold_patch: str,
    *,
    template: str | None = None,
    repeats: int = 2,
    parallel: int = 1,
    sandbox_timeout: float = 3600,
    error_attempts: int = ERROR_ATTEMPTS,
    error_backoff: float = ERROR_BACKOFF_S,
    network: str | None = None,
    evidence: list[dict[str, Any]] | None = None,
    evaluate: Callable[..., EvalResult] = evaluate_patch,
) -> dict[str, Any]:
    """Validate one task: gold and empty patch, ``repeats`` fresh evaluations each, ``parallel`` at once.

    A run whose evaluation failed for infrastructure reasons is tried again, up to ``error_attempts``
    tries, waiting ``error_backoff`` * 2**k seconds before try k+2. ``network`` goes to every fresh
    sandbox. Each evaluation's evidence record (log + status map) is appended to ``evidence``.
    Returns the task's validation record (byte-stable except for ``timings``/``runs[*].timings``).
    A gold patch that touches tests or is empty is ``gold_fails`` without running anything.
    """
    iid = str(metadata.get("instance_id", ""))
    template = template or metadata["sandbox_image"]
    t0 = time.monotonic()
    pre_reason, test_files = check_patch(gold_patch)
    jobs = [] if pre_reason else [(k, i) for i in range(repeats) for k in ("gold", "empty")]

    extra: dict[str, Any] = {"trusted_patch": True}
    if network is not None:
        extra["network"] = network
    found: dict[tuple[str, int], list[dict[str, Any]]] = {}

    def one(job: tuple[str, int]) -> dict[str, Any]:
        kind, i = job
        patch = gold_patch if kind == "gold" else ""
        failed: list[str] = []
        for attempt in range(1, max(1, error_attempts) + 1):
            res = evaluate(
                provider, template, dict(metadata), patch, sandbox_timeout=sandbox_timeout, **extra
            )
            found.setdefault(job, []).append(evidence_record(res, patch=kind, run=i, attempt=attempt))
            if res.failure_reason not in INFRA_REASONS:
                break
            failed.append(f"{res.failure_reason}: {res.error or ''}".strip())
            log.warning(
                "%s %s run %d try %d/%d: infrastructure failure %s (%s)",
                iid, kind, i, attempt, error_attempts, res.failure_reason, res.error,
            )  # fmt: skip
            if attempt < error_attempts:
                time.sleep(error_backoff * 2 ** (attempt - 1))
        log.info("%s %s run %d: resolved=%s reason=%s", iid, kind, i, res.resolved, res.failure_reason)
        return run_record(kind, i, res, failed[: attempt - 1])

    with cf.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        runs = list(pool.map(one, jobs))
    if evidence is not None:
        for job in jobs:
            evidence.extend(found.get(job, []))
    gold = [r for r in runs if r["patch"] == "gold"]
    empty = [r for r in runs if r["patch"] == "empty"]
    verdict, reason = decide(gold, empty, pre_reason)
    eval_s = [r["timings"].get("eval_s", 0.0) for r in runs]
    total_s = [r["timings"].get("total_s", 0.0) for r in runs]
    return {
        "instance_id": iid,
        "template": template,
        "provider": getattr(provider, "name", ""),
        "repeats": repeats,
        "verdict": verdict,
        "reason": reason,
        "gold_test_files": test_files,
        "gold": {"resolved": sum(r["resolved"] for r in gold), "runs": len(gold)},
        "empty": {"resolved": sum(r["resolved"] for r in empty), "runs": len(empty)},
        "runs": runs,
        "timings": {
            "wall_s": round(time.monotonic() - t0, 3),
            "eval_s": round(sum(eval_s), 3),
            "sandbox_s": round(sum(total_s), 3),
            "overhead_s": round(sum(total_s) - sum(eval_s), 3),
        },
    }


def provider_from_config(name: str, sandbox_cfg: Mapping[str, Any] | None = None) -> Provider:
    """The provider for fresh evaluations: no blackbox server (grading needs none); offline unless a
    create call asks for ``network="internet"`` (``sweflow.evaluate.eval_network``)."""
    from .stages_sandbox import provider_from_config as configured

    cfg = dict(sandbox_cfg or {})
    provider = configured(name, cfg, purpose="eval")
    docker_network = (cfg.get("network") or {}).get("docker_network")
    if docker_network and hasattr(provider, "internet_network"):
        provider.internet_network = docker_network
    return provider


def validate_task_file(
    task_file: str | os.PathLike,
    out: str | os.PathLike,
    *,
    provider: Provider,
    repeats: int = 2,
    parallel: int = 1,
    evidence_out: str | os.PathLike | None = None,
    network_cfg: Mapping[str, Any] | None = None,
    error_attempts: int = ERROR_ATTEMPTS,
    error_backoff: float = ERROR_BACKOFF_S,
    evaluate: Callable[..., EvalResult] = evaluate_patch,
) -> dict[str, Any]:
    """Validate the task in ``task_file`` (written by write_task_inputs) and write its record atomically;
    ``evidence_out`` gets every evaluation's log and status map (``write_evidence``). ``network_cfg`` is
    the ``sandbox.network`` config section."""
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
        network=eval_network(network_cfg, str(meta.get("repo") or "")),
        evidence=evidence,
        evaluate=evaluate,
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
) -> dict[str, Any]:
    """Write the summary report and ``tasks.valid.jsonl`` (the JSONL's own lines, in order, valid ones only).

    Every JSONL task appears in the summary: valid, under ``broken`` (a verdict about the task) or under
    ``errors`` (verdict ``error``: the infrastructure failed, nothing is known about the task; a task with
    no result file is one too, reason ``no validation result``). With ``reopen_errors`` (the rule) each
    error task's result file and its provenance record are removed once the summary is written; after the
    run, ``reopen_summaries`` dates such a summary back, so the next run re-runs it, which first
    re-validates the removed tasks (and only those).
    """
    by_id: dict[str, dict[str, Any]] = {}
    paths: dict[str, Path] = {}
    for path in results:
        rec = read_json(path)
        by_id[rec["instance_id"]] = rec
        paths[rec["instance_id"]] = Path(path)
    rows = read_jsonl_rows(jsonl)
    verdicts: Counter[str] = Counter()
    broken, errors, kept = [], [], []
    for iid, line in rows:
        rec = by_id.get(iid)
        verdict = rec["verdict"] if rec else "error"
        reason = rec.get("reason") if rec else "no validation result"
        verdicts[verdict] += 1
        if verdict == "valid":
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
        "broken": broken,
        "errors": errors,
    }
    atomic_write(valid_out, "".join(kept))
    atomic_write_json(summary_out, summary)
    log.info(
        "validation: %d/%d tasks valid; %d broken (left out): %s",
        len(kept),
        len(rows),
        len(broken),
        [f"{b['instance_id']} ({b['verdict']})" for b in broken],
    )
    if errors:
        log.error(
            "validation: %d tasks could NOT be validated (infrastructure failures, not verdicts about the "
            "tasks; left out of tasks.valid.jsonl this time, the next run retries them): %s",
            len(errors),
            "; ".join(f"{e['instance_id']}: {e['reason']}" for e in errors),
        )
        if reopen_errors:
            from .provenance.records import record_path

            for e in errors:
                result = paths.get(e["instance_id"])
                if result is None:
                    continue
                result.unlink(missing_ok=True)
                try:
                    record_path(result).unlink(missing_ok=True)
                except ProvenanceError:  # a result outside the provenance root has no record
                    pass
    return summary


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
