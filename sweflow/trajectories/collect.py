"""Expert trajectories: k attempts per task with the real agent, then every patch graded in a fresh sandbox.

`collect_trajectories` runs the rollout dispatcher in collect-only mode, the proxy recording every turn;
`grade_predictions` keeps only completed attempts whose patch resolves the task and broke no integrity
rule. An infrastructure failure is reported as such, never as a verdict on the task.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..grading.evaluate import INFRA_REASONS, check_patch
from ..grading.integrity import DEFAULT_RULES, IntegrityRules
from ..progress import item_log
from ..rollout.types import RolloutResult, patch_stats
from ..schema import default

log = logging.getLogger("sweflow.trajectories")

GRADED, ERROR, NOT_COLLECTED = "graded", "error", "not_collected"


def prediction_record(result: RolloutResult, attempt: int) -> dict[str, Any]:
    """One attempt as stored: ids, outcome, the patch text, integrity findings and the recorded turns."""
    return {
        "id": f"{result.instance_id}.{attempt}",
        "instance_id": result.instance_id,
        "attempt": attempt,
        "session_id": result.session_id,
        "status": result.status,
        "failure_reason": result.failure_reason,
        "error": result.error,
        "patch": result.patch_text,
        "patch_stats": {k: v for k, v in result.patch.items() if k != "test_files"},
        "patch_test_files": list(result.patch.get("test_files") or []),
        "integrity_violations": list(result.integrity_violations),
        "agent": dict(result.agent),
        "num_turns": result.num_turns,
        "timings": dict(result.timings),
        "turns": [
            {
                k: t.get(k)
                for k in ("index", "model", "stop_reason", "aborted", "tool_calls", "request", "response")
            }
            for t in result.turns
        ],
    }


# `collect_trajectories` runs the rollout dispatcher in collect-only mode (`RolloutConfig.evaluate` False):
# Claude Code in the task's sandbox, its model calls through the proxy in pass-through mode (an `Upstream`:
# the real API, or the scripted expert offline), the proxy recording every turn's request and response. Each
# attempt becomes a prediction record: the patch, the recorded turns, the tool-call integrity scan (made from
# the calls the proxy saw, never from the sandbox's account) and the agent's outcome.
def collect_trajectories(
    rows: Sequence[Mapping[str, Any]],
    *,
    provider: Any,
    upstream: Any,
    attempts: int,
    max_concurrency: int = 2,
    session_prefix: str = "expert.",
    integrity_rules: IntegrityRules = DEFAULT_RULES,
    proxy_config: Any = None,
    host: str = default("sft.collect.proxy.host"),
    port: int = default("sft.collect.proxy.port"),
    public_url: str | None = None,
) -> list[dict[str, Any]]:
    """`attempts` collect-only rollouts of every row through a pass-through proxy in front of `upstream`
    (listening on host:port; `public_url`: how sandboxes reach it when not on this machine, e.g. E2B);
    prediction records in (row, attempt) order."""
    from ..proxy import ProxyConfig, ProxyServer
    from ..rollout.clients import HttpProxyClient
    from ..rollout.dispatcher import Dispatcher
    from ..rollout.types import RolloutConfig

    cfg = RolloutConfig(
        max_concurrency=max_concurrency,
        session_prefix=session_prefix,
        integrity_rules=integrity_rules,
        evaluate=False,
        router_url=public_url,
    )
    pcfg = proxy_config or ProxyConfig(
        max_new_tokens=32000, max_session_requests=400, max_session_in_flight=2
    )
    with ProxyServer(upstream, None, pcfg, host=host, port=port) as proxy:
        client = HttpProxyClient(proxy.url, admin_token=proxy.admin_token)
        dispatcher = Dispatcher(provider, client, config=cfg)
        groups = dispatcher.run_groups([dict(r) for r in rows], attempts)
    out = []
    for group in groups:
        for attempt, result in enumerate(group):
            out.append(prediction_record(result, attempt))
            log.info(
                "collected %s attempt %d: %s%s (%d turns)",
                result.instance_id,
                attempt,
                result.status,
                f" ({result.failure_reason})" if result.failure_reason else "",
                result.num_turns,
            )
    return out


def _graded(pred: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
    base = {
        "id": pred["id"],
        "instance_id": pred["instance_id"],
        "attempt": pred.get("attempt"),
        "status": GRADED,
        "resolved": False,
        "failure_reason": None,
        "integrity_violations": list(pred.get("integrity_violations") or []),
        "kept": False,
        "drop_reason": None,
        "error": None,
        "statuses": {},
    }
    base.update(kw)
    return base


def grade_prediction(
    pred: Mapping[str, Any],
    row: Mapping[str, Any] | None,
    *,
    provider: Any,
    evaluator: Any,
) -> tuple[dict[str, Any], str]:
    """(evaluation record, the fresh evaluation's log) for one prediction."""
    if pred.get("status") != "completed":
        return _graded(
            pred, status=NOT_COLLECTED, drop_reason=f"collection_aborted:{pred.get('failure_reason')}"
        ), ""
    if row is None:
        return _graded(pred, status=ERROR, drop_reason="task_not_in_split", error="no training row"), ""
    patch = str(pred.get("patch") or "")
    # Re-check the patch here rather than trust the collection's verdict on it.
    reason, tests = check_patch(patch)
    violations = list(pred.get("integrity_violations") or [])
    if reason:
        drop = f"integrity_violation:{violations[0].get('rule')}" if violations else reason
        return _graded(pred, failure_reason=reason, drop_reason=drop, patch_test_files=tests), ""
    meta = dict(row.get("metadata") or {})
    ev = evaluator.evaluate_patch(provider, str(meta.get("sandbox_image") or ""), meta, patch)
    failure = getattr(ev, "failure_reason", None)
    err = getattr(ev, "error", None)
    log_text = str(getattr(ev, "log", "") or "")
    statuses = dict(sorted((getattr(ev, "statuses", None) or {}).items()))
    if err or failure in INFRA_REASONS:
        return _graded(pred, status=ERROR, failure_reason=failure, error=str(err or failure)[:500],
                       drop_reason="evaluation_error", statuses=statuses), log_text  # fmt: skip
    resolved = bool(getattr(ev, "resolved", False))
    if violations:
        drop = f"integrity_violation:{violations[0].get('rule')}"
    elif not resolved:
        drop = f"not_resolved:{failure or 'tests_failed'}"
    else:
        drop = None
    return _graded(
        pred,
        resolved=resolved,
        failure_reason=failure,
        kept=drop is None,
        drop_reason=drop,
        statuses=statuses,
        patch_sha256=patch_stats(patch)["sha256"],
    ), log_text


# `grade_predictions` evaluates each prediction's patch in a fresh sandbox with the same evaluator the reward
# uses, and decides what may be trained on: only a completed attempt whose patch resolves the task and whose
# tool calls and patch broke no integrity rule is kept. An attempt whose collection or evaluation failed for
# an infrastructure reason is reported as such (`status` "aborted" / "error"), never as a verdict on the task.
def grade_predictions(
    predictions: Sequence[Mapping[str, Any]],
    rows: Mapping[str, Mapping[str, Any]],
    *,
    provider: Any,
    evaluator: Any,
    parallel: int = default("sft.evaluate.parallel"),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(evaluation records, evidence records) in prediction order; `rows` maps instance id -> training row."""
    progress = item_log(len(predictions), "grade", log)

    def one(pred: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        try:
            done = grade_prediction(
                pred, rows.get(pred["instance_id"]), provider=provider, evaluator=evaluator
            )
        except Exception as exc:  # noqa: BLE001 - one prediction's fault is reported, the others go on
            log.warning("grading %s failed: %s", pred.get("id"), exc)
            done = _graded(pred, status=ERROR, drop_reason="evaluation_error",
                           error=f"{type(exc).__name__}: {exc}"[:500]), ""  # fmt: skip
        rec = done[0]
        progress.update(item=str(rec.get("id")), ok=rec.get("status") != ERROR,
                        note="kept" if rec.get("kept") else f"dropped ({rec.get('drop_reason')})")  # fmt: skip
        return done

    with concurrent.futures.ThreadPoolExecutor(max(1, parallel), thread_name_prefix="grade") as pool:
        done = list(pool.map(one, predictions))
    evidence = [
        {
            "id": rec["id"],
            "instance_id": rec["instance_id"],
            "status": rec["status"],
            "resolved": rec["resolved"],
            "failure_reason": rec["failure_reason"],
            "statuses": rec["statuses"],
            "log": text,
        }  # fmt: skip
        for rec, text in done
    ]
    return [rec for rec, _ in done], evidence
