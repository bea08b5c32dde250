"""Rollouts of the policy being trained: the token-recording proxy in front of an engine, sweflow's
Dispatcher over a sandbox provider, and what a trainer needs from each sample.

`PolicyRollouts` runs samples through `Dispatcher.run_sample`; `completion_of`, `sample_record` and
`step_stats` turn results into what a trainer needs. Aborted samples are never trained on as reward 0.
"""

from __future__ import annotations

import concurrent.futures
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..grading.reasons import tamper_counts
from ..proxy import ProxyConfig, ProxyServer
from ..rollout.clients import HttpProxyClient
from ..rollout.dispatcher import Dispatcher
from ..rollout.types import RolloutConfig, RolloutResult
from ..sandbox.base import Provider
from ..sandbox.settings import NetworkSettings
from ..schema import default


@dataclass
class Lineage:
    """One trainable sequence: a lineage's first prompt, then everything after it (cut to the context)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    env_mask: list[int]  # 1 = a token the model generated (trained on), 0 = tool output / template
    truncated: bool


@dataclass
class Completion:
    """A rollout as a trainer takes it: its final lineage (the one GRPO's group sees) in the first fields,
    and the earlier lineages of a split session (compaction, rewritten history) in `extras`, each trained
    with the session's advantage."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    env_mask: list[int]  # 1 = a token the model generated (trained on), 0 = tool output / template
    valid: bool
    segments: int  # linearised samples the proxy recorded for the session (>1: it split the session)
    truncated: bool
    extras: list[Lineage] = field(default_factory=list)


def lineage_of(sample: dict, *, max_context_tokens: int) -> Lineage | None:
    """A proxy sample as a Lineage cut to `max_context_tokens` in all; None without a model token."""
    cut = int(sample["prompt_length"])
    ids, mask, lps = sample["token_ids"], sample["loss_mask"], sample["rollout_logprobs"]
    comp, env, lp = list(ids[cut:]), [int(m) for m in mask[cut:]], [float(x) for x in lps[cut:]]
    room = max(0, max_context_tokens - cut)  # the whole sample fits the context window
    truncated = len(comp) > room
    comp, env, lp = comp[:room], env[:room], lp[:room]
    if not comp or not any(env):
        return None
    return Lineage(list(ids[:cut]), comp, lp, env, truncated)


# `completion_of` turns a result into its final lineage (prompt, completion, logprobs, env_mask) plus the
# earlier lineages of a split session.
#
# Aborted samples (sandbox died, agent timeout, proxy error, evaluation infrastructure) are `valid=False`:
# left out of the update and counted by reason, never trained on as reward 0.
def completion_of(result: RolloutResult, *, max_context_tokens: int, pad_id: int) -> Completion:
    """The session's linearised samples as a Completion: the last one (its reward's) first, the earlier
    lineages in `extras` (every lineage is trained, as on verl).

    An aborted sample, or one whose last sample has no recorded model token, is a one-token placeholder with
    `valid=False`, no loss token and no extras.
    """
    samples = list(result.samples or [])
    if result.aborted or not samples:
        return Completion([pad_id], [pad_id], [0.0], [0], False, len(samples), False)
    last = lineage_of(samples[-1], max_context_tokens=max_context_tokens)
    if last is None:
        truncated = len(samples[-1]["token_ids"]) > max_context_tokens
        return Completion([pad_id], [pad_id], [0.0], [0], False, len(samples), truncated)
    extras = [x for s in samples[:-1] if (x := lineage_of(s, max_context_tokens=max_context_tokens))]
    return Completion(
        last.prompt_ids, last.completion_ids, last.logprobs, last.env_mask, True, len(samples),
        last.truncated, extras,
    )  # fmt: skip


# `sample_record` is the rollouts/step-<n>.jsonl line (no secret, no patch text).
def sample_record(
    result: RolloutResult, *, step: int, group: int, completion: Completion | None = None
) -> dict:
    """The rollouts/step-<n>.jsonl line of one sample: outcome and sizes, no secret and no patch text."""
    samples = result.samples or []
    rec = {
        "step": step,
        "instance_id": result.instance_id,
        "group": group,
        "group_index": result.group_index,
        "session_id": result.session_id,
        "status": result.status,
        "aborted": result.aborted,
        "reward": None if result.aborted else float(result.reward),
        "resolved": bool(result.resolved),
        "failure_reason": result.failure_reason,
        "turns": int(result.num_turns),
        "segments": len(samples),
        "prompt_tokens": int(samples[0]["prompt_length"]) if samples else 0,
        "response_tokens": sum(sum(s["loss_mask"]) for s in samples),
        "total_tokens": sum(len(s["token_ids"]) for s in samples),
        "patch_bytes": (result.patch or {}).get("bytes"),
        "patch_files": (result.patch or {}).get("files"),
        "integrity_violations": [v.get("rule") for v in result.integrity_violations or []],
        "timings": dict(sorted((result.timings or {}).items())),
    }
    if completion is not None:
        lineages = [completion, *completion.extras] if completion.valid else []
        rec["trained"] = completion.valid
        rec["trained_lineages"] = len(lineages)
        rec["trained_tokens"] = sum(sum(x.env_mask) for x in lineages)
        rec["truncated"] = completion.truncated or any(x.truncated for x in completion.extras)
    return rec


def sample_std(values: Sequence[float]) -> float:
    """Unbiased standard deviation (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def tamper_stats(reasons: Iterable[str | None]) -> dict[str, Any]:
    """The tamper verdicts among one step's completed samples (their failure reasons): `tampered` (how many)
    and `tampered_by_reason` (by code, every code present); both engines' metrics.jsonl carry these."""
    counts = tamper_counts(reasons)
    return {"tampered": sum(counts.values()), "tampered_by_reason": counts}


# `step_stats` gives the rollout half of a metrics.jsonl line.
def step_stats(records: Sequence[dict]) -> dict[str, Any]:
    """Rollout statistics of one step from its sample records (the counts add up: completed + aborted =
    samples; groups_with_gradient + groups_without_gradient = groups)."""
    done = [r for r in records if not r["aborted"]]
    rewards = [float(r["reward"]) for r in done]
    by_group: dict[int, list[float]] = {}
    for r in done:
        by_group.setdefault(int(r["group"]), []).append(float(r["reward"]))
    groups = {int(r["group"]) for r in records}
    scored = {g: v for g, v in by_group.items() if len(v) >= 2}
    varied = [g for g, v in scored.items() if max(v) != min(v)]
    return {
        "samples": len(records),
        "completed": len(done),
        "aborted": len(records) - len(done),
        "aborted_by_reason": dict(
            sorted(Counter(r["failure_reason"] or "unknown" for r in records if r["aborted"]).items())
        ),
        "failure_reasons": dict(
            sorted(Counter(r["failure_reason"] for r in done if r["failure_reason"]).items())
        ),
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "reward_std": sample_std(rewards) if rewards else None,
        "resolved_share": sum(1 for r in done if r["resolved"]) / len(done) if done else None,
        "groups": len(groups),
        "groups_with_gradient": len(varied),
        "groups_without_gradient": len(groups) - len(varied),
        "zero_variance_group_share": (len(scored) - len(varied)) / len(scored) if scored else None,
        "small_groups": len(groups) - len(scored),
        "integrity_violations": sum(len(r["integrity_violations"]) for r in records),
        **tamper_stats(r["failure_reason"] for r in done),
        "prompt_tokens": sum(r["prompt_tokens"] for r in records),
        "response_tokens": sum(r["response_tokens"] for r in records),
        "split_sessions": sum(1 for r in records if r["segments"] > 1),
    }


# `PolicyRollouts` starts one proxy (engine = the live policy for TRL) and runs (row, group index) pairs
# through `Dispatcher.run_sample`: sandbox, Claude Code through the proxy, patch, fresh-sandbox evaluation,
# integrity, reward.
class PolicyRollouts:
    """One proxy in front of `engine` and a Dispatcher over `provider`; `with PolicyRollouts(...) as pr:`.

    `public_url` is the proxy as sandboxes reach it (E2B: a public HTTP(S) URL); None: the listening address
    (local and Docker sandboxes get a route to exactly that port). `tampered_reward` is the reward of a
    runner_tampered verdict (`train.reward.tampered`).
    """

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        provider: Provider,
        *,
        max_new_tokens: int,
        max_context_tokens: int | None,
        temperature: float,
        top_p: float,
        top_k: int,
        host: str,
        port: int,
        public_url: str | None,
        max_concurrency: int,
        turn_timeout: float | None,
        session_prefix: str,
        eval_network: NetworkSettings,
        tampered_reward: float = default("train.reward.tampered"),
        token_build_mode: str,
        token_build_model: str,
    ) -> None:
        self.proxy = ProxyServer(
            engine,
            tokenizer,
            ProxyConfig(
                max_new_tokens=max_new_tokens,
                max_context_tokens=max_context_tokens,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                token_build_mode=token_build_mode,
                token_build_model=token_build_model,
            ),
            host=host,
            port=port,
        )
        self.provider = provider
        self.public_url = public_url
        self.config = RolloutConfig(
            max_concurrency=max_concurrency,
            turn_timeout=turn_timeout,
            session_prefix=session_prefix,
            eval_network=eval_network,
            router_url=public_url,
            tampered_reward=tampered_reward,
        )
        self.dispatcher: Dispatcher | None = None

    def __enter__(self) -> PolicyRollouts:
        self.proxy.start()
        if self.public_url and "{port}" in self.public_url:  # each proxy publishes its own port
            port = self.proxy.url.rsplit(":", 1)[1]
            self.config.router_url = self.public_url.replace("{port}", port)
        client = HttpProxyClient(self.proxy.url, admin_token=self.proxy.admin_token)
        self.dispatcher = Dispatcher(self.provider, client, config=self.config)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proxy.stop()

    def run(self, jobs: Sequence[tuple[dict[str, Any], int]], prefix: str = "") -> list[RolloutResult]:
        """Run every (row, group index) under the dispatcher's concurrency limit; results in job order."""
        if self.dispatcher is None:
            raise RuntimeError("PolicyRollouts is not started (use it as a context manager)")
        self.dispatcher.config.session_prefix = prefix or self.config.session_prefix
        out: list[RolloutResult | None] = [None] * len(jobs)
        workers = max(1, min(len(jobs), self.config.max_concurrency))
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="train-rollout") as pool:
            futures = {pool.submit(self.dispatcher.run_sample, row, g): i for i, (row, g) in enumerate(jobs)}
            for fut in concurrent.futures.as_completed(futures):
                out[futures[fut]] = fut.result()
        return [r for r in out if r is not None]
