"""Evaluate stage: a checkpoint's resolve rate on a held-out split (`evaluate_checkpoint_step`), and a
predictions file made elsewhere graded on the same tasks (`grade_predictions_step`), both in SWE-bench's
formats (predictions.jsonl, the harness's run report.json).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DatasetError
from ..evaluation import harness_formats as hf
from ..evaluation.checkpoint import SeededEngine, attempt_record, run_attempts
from ..evaluation.metrics import resolve_figures
from ..grading.evidence import write_evidence
from ..rulekit import from_snakemake
from ..sandbox.registry import provider_from_config
from ..sandbox.settings import SandboxSettings
from ..schema import default, defaults
from ..smith.candidates import write_jsonl
from ..util import atomic_write_json

log = logging.getLogger("sweflow.evaluate")

__all__ = ["evaluate_checkpoint_step", "from_snakemake", "grade_predictions_step"]


def _rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]
    if not rows:
        raise DatasetError("no valid task to evaluate on", file=str(path),
                           hint="every task of the split failed validation; see its validation-summary.json")  # fmt: skip
    return rows


def _without_tail(evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """The grade without its log tail (the whole log is beside it; the tail's cut falls differently with the
    run's canary names, so it would make two runs' evidence differ)."""
    marker = {k: v for k, v in (evaluation.get("marker") or {}).items() if k != "log_tail"}
    return {**evaluation, **({"marker": marker} if evaluation.get("marker") is not None else {})}


def _attempts(
    engine: Any,
    tokenizer: Any,
    prov: Any,
    rows: list,
    k: int,
    *,
    checkpoint: str,
    recipe: Any,
    proxy: Any,
    public_url: str | None,
    provider: str,
    settings: Any,
    parallel: int,
) -> list:
    """`k` attempts at each row through the training's proxy and rollouts on `engine` (patches kept)."""
    from ..train.proxy_settings import CLOUD_PROVIDERS
    from ..train.rollouts import PolicyRollouts

    rollouts = PolicyRollouts(
        engine, tokenizer, prov,
        max_new_tokens=recipe.max_response_tokens, max_context_tokens=recipe.max_context_tokens,
        temperature=recipe.temperature, top_p=recipe.top_p, top_k=recipe.top_k,
        host=proxy.host, port=proxy.port if provider in CLOUD_PROVIDERS else 0, public_url=public_url,
        max_concurrency=parallel, turn_timeout=recipe.turn_timeout,
        session_prefix=f"eval.{checkpoint}.", eval_network=settings.network,
        tampered_reward=recipe.tampered_reward,
        token_build_mode=proxy.build_mode, token_build_model=proxy.build_model,
    )  # fmt: skip
    rollouts.config.keep_patch = True
    with rollouts:
        return run_attempts(rollouts, rows, k, prefix=f"eval.{checkpoint}.")


def evaluate_checkpoint_step(
    model_dir: str | os.PathLike,
    tasks: str | os.PathLike,
    outputs: Mapping[str, str],
    *,
    checkpoint: str,
    evaluate: Mapping[str, Any],
    train: Mapping[str, Any],
    sandbox: Mapping[str, Any],
    provider: str,
) -> dict[str, Any]:
    """The agent `evaluate.attempts` times at each valid task of the split, on the local engine serving
    `model_dir`, through the training's proxy and sandboxes, each patch graded fresh (the same rules and
    decoy runs as training). `outputs`: summary, attempts, predictions, report, evidence."""
    from transformers import AutoTokenizer

    from ..evaluation.serve import served, vllm_command
    from ..proxy.engines import TransformersEngine, VLLMEngine
    from ..train.proxy_settings import ProxySettings, eval_reach_problem
    from ..train.recipe import Recipe
    from ..train.resume import weights_sha256

    started = time.monotonic()
    rows = _rows(tasks)
    k, seed = int(evaluate["attempts"]), int(evaluate["seed"])
    recipe = Recipe.from_config(train)
    proxy, settings = ProxySettings.from_config(train), SandboxSettings.from_config(sandbox)
    # cloud sandboxes reach this job's own proxy at the declared port and URL (no Ray gateway runs here)
    public_url = evaluate.get("proxy_url") or proxy.public_url
    problem = eval_reach_problem(provider, port=proxy.port, train_url=proxy.public_url,
                                 eval_url=evaluate.get("proxy_url"), engine=recipe.engine)  # fmt: skip
    if problem:
        raise ConfigError(problem[0], field=problem[1], hint=problem[2])
    prov = provider_from_config(provider, settings)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    kind = evaluate.get("engine") or default("evaluate.engine")
    log.info("evaluating %s on %d task(s), %d attempt(s) each (seed %d, %s engine)", checkpoint, len(rows), k,
             seed, kind)  # fmt: skip
    with contextlib.ExitStack() as stack:
        if kind == "vllm":
            opts = defaults("evaluate.vllm", evaluate.get("vllm"))
            url = stack.enter_context(served(
                vllm_command(model_dir, name=checkpoint, seed=seed, options=opts),
                f"http://127.0.0.1:{int(opts['port'])}", log_path=Path(outputs["summary"]).with_name("vllm.log"),
                startup_timeout=float(opts["startup_timeout_sec"]),
            ))  # fmt: skip
            inner: Any = VLLMEngine(url, checkpoint, timeout=float(recipe.turn_timeout or 600))
        else:
            inner = TransformersEngine(str(model_dir))
        results = _attempts(SeededEngine(inner, seed), tokenizer, prov, rows, k, checkpoint=checkpoint,
                            recipe=recipe, proxy=proxy, public_url=public_url, provider=provider,
                            settings=settings, parallel=int(evaluate["parallel"]))  # fmt: skip
    attempts = [attempt_record(r) for r in results]
    graded = [a for a in attempts if a["status"] == "completed"]
    figures = resolve_figures(graded, k, seed=seed)
    # SWE-bench's files: one prediction per task, its first attempt the infrastructure did not lose
    preds, outcomes = [], {}
    for row in rows:
        iid = row["metadata"]["instance_id"]
        mine = [r for r in results if r.instance_id == iid]
        first = next((r for r in mine if not r.aborted), mine[0] if mine else None)
        if first is None:
            continue
        preds.append(hf.prediction(iid, checkpoint, first.patch_text))
        outcomes[iid] = hf.outcome(first.patch_text, {"resolved": first.resolved, "infra": first.aborted})
    report = hf.run_report([r["metadata"]["instance_id"] for r in rows], preds, outcomes)
    write_jsonl(outputs["attempts"], attempts)
    write_jsonl(outputs["predictions"], preds)
    atomic_write_json(outputs["report"], report)
    write_evidence(outputs["evidence"], [
        {"instance_id": r.instance_id, "attempt": r.group_index, "status": r.status, "resolved": r.resolved,
         "failure_reason": r.failure_reason, "evaluation": _without_tail(r.evaluation), "log": r.evaluation_log}
        for r in results
    ])  # fmt: skip
    summary = {
        "checkpoint": checkpoint,
        "weights_sha256": weights_sha256(model_dir),
        "tasks_file": str(tasks),
        "engine": kind,
        "seed": seed,
        "sampling": {
            "temperature": recipe.temperature,
            "top_p": recipe.top_p,
            "top_k": recipe.top_k,
            "max_response_tokens": recipe.max_response_tokens,
        },  # fmt: skip
        "lost_attempts": sum(a["status"] != "completed" for a in attempts),
        **figures,
        "harness_report": {
            k_: report[k_]
            for k_ in (
                "resolved_instances",
                "unresolved_instances",
                "empty_patch_instances",
                "error_instances",
            )
        },  # fmt: skip
        "seconds": round(time.monotonic() - started, 1),
    }
    atomic_write_json(outputs["summary"], summary)
    lo, hi = figures["pass@1_interval"]
    log.info("%s: pass@1 %.3f [%.3f, %.3f], pass@%d %.3f over %d task(s), %d attempt(s) graded", checkpoint,
             figures["pass@1"], lo, hi, k, figures[f"pass@{k}"], figures["tasks"], len(graded))  # fmt: skip
    return summary


def grade_predictions_step(
    predictions: str | os.PathLike,
    tasks: str | os.PathLike,
    outputs: Mapping[str, str],
    *,
    sandbox: Mapping[str, Any],
    provider: str,
) -> dict[str, Any]:
    """Every prediction of a file made elsewhere (another agent's, a leaderboard submission's) graded on the
    split's valid tasks in a fresh sandbox, as an agent's patch is (integrity rules, canaries, decoy runs).
    `outputs`: report (the harness's run report), graded (one line per prediction), evidence."""
    from ..rollout.evaluator import FreshEvaluator

    rows = {r["metadata"]["instance_id"]: r for r in _rows(tasks)}
    preds = hf.read_predictions(predictions)
    settings = SandboxSettings.from_config(sandbox)
    prov = provider_from_config(provider, settings, purpose="eval")
    evaluator = FreshEvaluator(network=settings.network)
    graded, evidence, outcomes = [], [], {}
    for p in preds:
        iid, patch = p[hf.INSTANCE_ID], p[hf.PATCH]
        row = rows.get(iid)
        rec: dict[str, Any] = {"instance_id": iid, "model_name_or_path": p[hf.MODEL]}
        if row is None:
            rec.update(outcome="not_a_task", failure_reason=None)
            log.warning("prediction for %s: not a valid task of %s (left out of the report)", iid, tasks)
        elif not patch:
            outcomes[iid] = rec["outcome"] = hf.EMPTY
            rec["failure_reason"] = "empty_patch"
        else:
            meta = dict(row["metadata"])
            ev = evaluator.evaluate_patch(prov, str(meta.get("sandbox_image") or ""), meta, patch)
            outcomes[iid] = rec["outcome"] = hf.outcome(patch, {"resolved": ev.resolved, "infra": ev.infra})
            rec["failure_reason"] = ev.failure_reason
            evidence.append({"instance_id": iid, "failure_reason": ev.failure_reason, "statuses": ev.statuses,
                             "log": ev.log})  # fmt: skip
        graded.append(rec)
    report = hf.run_report(list(rows), [p for p in preds if p[hf.INSTANCE_ID] in rows], outcomes)
    write_jsonl(outputs["graded"], graded)
    atomic_write_json(outputs["report"], report)
    write_evidence(outputs["evidence"], evidence)
    log.info("graded %d prediction(s) of %s: %d resolved of %d tasks", len(preds), predictions,
             report["resolved_instances"], report["total_instances"])  # fmt: skip
    return report
