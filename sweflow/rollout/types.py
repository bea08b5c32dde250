"""Plain data of the rollout dispatcher: its settings and one sample's result."""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from sweflow.grading.integrity import DEFAULT_RULES, IntegrityRules
from sweflow.sandbox.settings import NetworkSettings
from sweflow.schema import default

COMPLETED = "completed"
ABORTED = "aborted"

# Why a sample was aborted, by the step that failed (the failure_reason of an aborted sample).
STEP_REASONS = {
    "sandbox": "sandbox_create_failed",
    "health": "blackbox_unhealthy",
    "proxy_session": "proxy_error",
    "register": "register_failed",
    "before_agent": "before_agent_failed",
    "agent": "agent_failed",
    "patch": "patch_extraction_failed",
    "evaluate": "evaluation_error",
    "trajectory": "proxy_error",
    "integrity": "integrity_scan_failed",
}
SANDBOX_DIED = "sandbox_died"


@dataclass
class RolloutConfig:
    """Dispatcher settings; every timeout is in seconds.

    `router_url`: the proxy as seen from inside the sandbox when the sandbox does not say it itself
    (`sandbox.egress_url`, which wins; default: the proxy client's URL, right for a public proxy URL). `turn_timeout` / `sandbox_timeout` default to the row's
    backend_options.turn_timeout / sandbox_timeout_sec. `session_prefix` makes session ids unique across
    runs that reuse one proxy. `delete_sessions` frees the proxy's copy once a sample's trajectory is read.
    `eval_network` is the ``sandbox.network`` settings for the fresh evaluation (default: offline).
    """

    router_url: str | None = None
    max_concurrency: int = default("train.rollout.max_concurrency")
    health_timeout: float = 120.0
    turn_timeout: float | None = None
    sandbox_timeout: float | None = None
    session_prefix: str = ""
    delete_sessions: bool = True
    integrity_rules: IntegrityRules = DEFAULT_RULES
    eval_network: NetworkSettings | None = None
    # The reward of a runner_tampered verdict (train.reward.tampered; <= 0), see grading.reward.price_tampering.
    tampered_reward: float = default("train.reward.tampered")
    # False: collect only (expert trajectories): no evaluation here, the patch text and the proxy's recorded
    # turns are kept in the result, and the patch is graded later in a fresh sandbox by a separate step.
    evaluate: bool = True
    # True: the patch text is kept in the result of an evaluated sample too (a checkpoint's evaluation
    # writes it to SWE-bench's predictions file)
    keep_patch: bool = False

    @classmethod
    def from_spec(
        cls, rollout: dict[str, Any], *, network: NetworkSettings, router_url: str | None
    ) -> RolloutConfig:
        """From a rollout spec's `rollout` section (verl's agent loop): fresh evaluations on the configured
        ``sandbox.network``, as the TRL engine's PolicyRollouts gives them."""
        return cls(**{**rollout, "router_url": router_url, "eval_network": network})


@dataclass
class RolloutResult:
    """One sample's outcome. `status` is "completed" (reward is meaningful) or "aborted" (drop it).

    `samples` are the proxy's linearised samples (token_ids, loss_mask, rollout_logprobs, prompt_length,
    num_turns, finish_reason, turn_indices, ...); `training_samples()` adds reward, group index, status
    and failure reason to each. `error` is a one-line description of what aborted the sample.
    `evaluation_log` is the fresh evaluation's whole host-side log (left out of `to_dict`; see
    `write_evidence`); an evaluation whose infrastructure failed aborts the sample (evaluation_error),
    it never gives reward 0.
    """

    instance_id: str
    group_index: int
    session_id: str
    status: str
    failure_reason: str | None
    reward: float = 0.0
    resolved: bool = False
    samples: list[dict[str, Any]] = field(default_factory=list)
    num_turns: int = 0
    patch: dict[str, Any] = field(default_factory=dict)
    evaluation: dict[str, Any] = field(default_factory=dict)
    integrity_violations: list[dict[str, Any]] = field(default_factory=list)
    agent: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    evaluation_log: str = field(default="", repr=False)
    # Collect-only runs (RolloutConfig.evaluate False): the patch itself and the proxy's recorded turns.
    patch_text: str = field(default="", repr=False)
    turns: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def aborted(self) -> bool:
        return self.status == ABORTED

    def training_samples(self) -> list[dict[str, Any]]:
        """Each recorded sample with the sample-level fields a trainer needs (none for aborted samples)."""
        if self.aborted:
            return []
        extra = {
            "reward": self.reward,
            "group_index": self.group_index,
            "status": self.status,
            "failure_reason": self.failure_reason,
            "instance_id": self.instance_id,
            "session_id": self.session_id,
        }
        return [{**s, **extra} for s in self.samples]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("evaluation_log")
        return out

    def evidence_record(self, **labels: Any) -> dict[str, Any]:
        """The grading's evidence: ``labels``, the outcome, the status map and the whole log."""
        ev = self.evaluation
        return {
            **labels,
            "instance_id": self.instance_id,
            "group_index": self.group_index,
            "session_id": self.session_id,
            "status": self.status,
            "failure_reason": ev.get("failure_reason"),
            "resolved": ev.get("resolved", False),
            "error": ev.get("error"),
            "exit_code": ev.get("exit_code"),
            "statuses": dict(sorted((ev.get("statuses") or {}).items())),
            "log": self.evaluation_log,
        }

    def write_evidence(self, path: str) -> None:
        """``evidence_record()`` as one gzip JSON line (byte-stable for the same record)."""
        from sweflow.grading.evaluate import write_evidence

        write_evidence(path, [self.evidence_record()])


def patch_stats(patch: str) -> dict[str, Any]:
    """Size, sha256, changed files and added/removed line counts of a git diff."""
    files = sorted(set(re.findall(r"^diff --git a/(\S+) b/", patch, re.M)))
    added = removed = 0
    for line in patch.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return {
        "bytes": len(patch.encode("utf-8")),
        "sha256": hashlib.sha256(patch.encode("utf-8")).hexdigest(),
        "files": files,
        "lines_added": added,
        "lines_removed": removed,
    }
