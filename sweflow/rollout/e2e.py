"""The end-to-end check: one sample task, the real agent in a real sandbox, driven by two scripted policies.

Each policy (`sweflow.offline.policies`: the gold fix, expected reward 1.0; the fix plus a test file,
expected 0.0 with integrity_violation:test_edit) runs behind the real token-recording proxy through the
`Dispatcher` with the fresh-sandbox evaluation; the recorded samples are checked token by token.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sweflow.proxy import ProxyConfig, ProxyServer
from sweflow.proxy.handler import HttpError
from sweflow.rollout.clients import HttpProxyClient
from sweflow.rollout.dispatcher import Dispatcher
from sweflow.rollout.evaluator import Evaluator
from sweflow.rollout.types import RolloutConfig, RolloutResult
from sweflow.sandbox.base import Provider
from sweflow.sandbox.settings import NetworkSettings
from sweflow.schema import default

if TYPE_CHECKING:
    from sweflow.offline.policies import ScriptedPolicy

log = logging.getLogger("sweflow.e2e")
POLICIES = ("gold", "test_edit")


def token_checks(result: RolloutResult, policy: ScriptedPolicy, tokenizer: Any, stop_text: str) -> dict:
    """Compare the recorded samples with what the policy produced.

    - lengths: token_ids, loss_mask and rollout_logprobs have equal lengths in every sample;
    - outputs: the loss-masked spans, in order over all samples, decode to exactly the produced texts
      (each followed by the stop token);
    - logprobs: every masked-in token carries the ScriptedEngine's logprob for its id and position,
      every masked-out token 0.0.
    """
    from sweflow.offline.scripted_engine import scripted_logprob

    spans: list[list[tuple[int, float]]] = []
    lengths_ok = True
    masked_lp_ok = True
    for s in result.samples:
        ids, mask, lps = s["token_ids"], s["loss_mask"], s["rollout_logprobs"]
        lengths_ok &= len(ids) == len(mask) == len(lps)
        prev = 0
        for tok, m, lp in zip(ids, mask, lps, strict=False):
            if m and not prev:
                spans.append([])
            if m:
                spans[-1].append((tok, lp))
            else:
                masked_lp_ok &= lp == 0.0
            prev = m
    decoded = [tokenizer.decode([t for t, _ in span]) for span in spans]
    expected = [text + stop_text for text in policy.produced]
    logprobs_ok = masked_lp_ok and all(
        lp == scripted_logprob(t, i) for span in spans for i, (t, lp) in enumerate(span)
    )
    return {
        "lengths_equal": bool(lengths_ok),
        "outputs_match": decoded == expected,
        "logprobs_match": bool(logprobs_ok),
        "output_spans": len(spans),
        "engine_calls": len(policy.produced),
        "output_tokens": sum(len(span) for span in spans),
    }


def expectation(name: str, result: RolloutResult) -> tuple[bool, str]:
    """Whether a policy's result is what it must be, and what was expected."""
    if name == "gold":
        ok = result.status == "completed" and result.reward == 1.0 and result.failure_reason is None
        return ok, "completed, reward 1.0, no failure reason"
    ok = (
        result.status == "completed"
        and result.reward == 0.0
        and (result.failure_reason or "").startswith("integrity_violation:test_edit")
    )
    return ok, "completed, reward 0.0, failure reason integrity_violation:test_edit"


def run_policy(
    row: Mapping[str, Any],
    policy: ScriptedPolicy,
    *,
    provider: Provider,
    tokenizer: Any,
    evaluator: Evaluator | None = None,
    config: RolloutConfig | None = None,
    evidence: list[dict[str, Any]] | None = None,
    trajectories: list[dict[str, Any]] | None = None,
    proxy_config: ProxyConfig | None = None,
    turns_out: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One rollout of `row` with `policy` behind a fresh proxy; the report entry for that policy. The
    grading's evidence record (whole log, status map) is appended to `evidence` when given, and the
    recorded token samples with the outcome to `trajectories` (what a warm start trains on).

    `proxy_config` defaults to ProxyConfig(max_new_tokens=4096). `turns_out` receives the proxy's recorded
    turns of the session (with request/response when `proxy_config.record_messages` is set)."""
    from sweflow.offline.scripted_engine import ScriptedEngine

    engine = ScriptedEngine(policy, tokenizer)
    pcfg = proxy_config or ProxyConfig(max_new_tokens=4096)
    with ProxyServer(engine, tokenizer, pcfg, host="127.0.0.1", port=0) as proxy:
        cfg = config or RolloutConfig(max_concurrency=1, session_prefix=f"e2e-{policy.name}.")
        if turns_out is not None:  # the dispatcher would free the session before we could read it
            cfg = dataclasses.replace(cfg, delete_sessions=False)
        client = HttpProxyClient(proxy.url, admin_token=proxy.admin_token)
        dispatcher = Dispatcher(provider, client, evaluator=evaluator, config=cfg)
        result = dispatcher.run_sample(dict(row), 0)
        stop_text = tokenizer.decode([proxy.stop_ids[0]]) if proxy.stop_ids else ""
        if turns_out is not None:
            try:
                turns_out.extend(proxy.read_trajectory(result.session_id).get("turns") or [])
            except HttpError:  # aborted before the proxy session existed: no turns
                pass
            proxy.delete_session(result.session_id)
    if evidence is not None:
        evidence.append(result.evidence_record(policy=policy.name))
    if trajectories is not None:
        trajectories.append(trajectory_record(policy.name, result))
    ok, expected = expectation(policy.name, result)
    checks = token_checks(result, policy, tokenizer, stop_text)
    tokens_ok = checks["lengths_equal"] and checks["outputs_match"] and checks["logprobs_match"]
    patch = {k: result.patch.get(k) for k in ("bytes", "files", "lines_added", "lines_removed", "sha256")}
    return {
        "policy": policy.name,
        "status": result.status,
        "reward": result.reward,
        "resolved": result.resolved,
        "failure_reason": result.failure_reason,
        "error": result.error,
        "patch": {**patch, "failure_reason": result.patch.get("failure_reason")},
        "evaluation_failure_reason": result.evaluation.get("failure_reason"),
        "integrity_violations": result.integrity_violations,
        "sample_count": len(result.samples),
        "num_turns": result.num_turns,
        "agent": result.agent,
        "token_checks": checks,
        "timings": result.timings,
        "expected": expected,
        "ok": bool(ok and tokens_ok),
    }


def trajectory_record(policy: str, result: RolloutResult) -> dict[str, Any]:
    """A policy's recorded session: outcome and each linearised sample's ids, loss mask and prompt length."""
    return {
        "policy": policy,
        "instance_id": result.instance_id,
        "status": result.status,
        "reward": result.reward,
        "failure_reason": result.failure_reason,
        "samples": [
            {"token_ids": s["token_ids"], "loss_mask": s["loss_mask"], "prompt_length": s["prompt_length"]}
            for s in result.samples
        ],
    }


def e2e_check(
    row: Mapping[str, Any],
    *,
    provider: Provider,
    tokenizer: Any,
    evaluator: Evaluator | None = None,
    policies: Sequence[str] = POLICIES,
    evidence: list[dict[str, Any]] | None = None,
    network: NetworkSettings | None = None,
    trajectories: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run the scripted policies on one training row; {instance_id, template, provider, ok, policies}.
    `network` is the ``sandbox.network`` settings for the fresh evaluations."""
    from sweflow.offline.policies import gold_policy, tamper_policy

    meta = row.get("metadata") or {}
    instance_id = str(meta.get("instance_id"))
    workdir = str(
        (meta.get("backend_options") or {}).get("working_directory")
        or meta.get("workdir")
        or default("agent.backend_options.working_directory")
    )
    makers = {"gold": gold_policy, "test_edit": tamper_policy}
    report: dict[str, Any] = {}
    for name in policies:
        policy = makers[name](instance_id, tokenizer, workdir)
        log.info("e2e %s: policy %s (%d scripted turns)", instance_id, name, len(policy.turns))
        cfg = RolloutConfig(max_concurrency=1, session_prefix=f"e2e-{name}.", eval_network=network)
        report[name] = run_policy(
            row,
            policy,
            provider=provider,
            tokenizer=tokenizer,
            evaluator=evaluator,
            config=cfg,
            evidence=evidence,
            trajectories=trajectories,
        )
        log.info(
            "e2e %s: %s -> %s reward=%s reason=%s ok=%s",
            instance_id,
            name,
            report[name]["status"],
            report[name]["reward"],
            report[name]["failure_reason"],
            report[name]["ok"],
        )
    return {
        "instance_id": instance_id,
        "provider": getattr(provider, "name", ""),
        "template": meta.get("sandbox_image"),
        "ok": all(p["ok"] for p in report.values()),
        "policies": report,
    }
