"""The codes a fresh evaluation's verdict can carry beyond the harness's and the integrity rules' own.

One module for them: grading, validation, rollouts and the report name a reason by these constants.
"""

from __future__ import annotations

from collections.abc import Iterable

EMPTY_GENERATION = "empty_generation"
LOG_TRUNCATED = "log_truncated"
PATCH_EXTRACTION_FAILED = "patch_extraction_failed"
PATCH_UNEXTRACTABLE = "patch_unextractable"
FAILED_APPLY_PATCH = "failed_apply_patch"
FRESH_EVAL_EXCEPTION = "fresh_eval_exception"
FRESH_EVAL_TIMEOUT = "fresh_eval_timeout"
SANDBOX_LOST = "sandbox_lost"
EVAL_NOT_RUN = "eval_not_run"
# Reasons that say nothing about the patch or the task: the evaluation itself did not happen.
INFRA_REASONS = (FRESH_EVAL_EXCEPTION, FRESH_EVAL_TIMEOUT, SANDBOX_LOST, EVAL_NOT_RUN)
# An agent's patch whose every evaluation lost its sandbox or ran past the deadline while the provider
# itself was healthy: a grade (reward 0), or the agent could turn a 0 into an aborted sample by crashing
# its own grader (see evaluate_agent_patch).
PATCH_DEFEATED_EVALUATION = "patch_defeated_evaluation"

# Tamper verdicts: the grading caught the patch (or the agent) working on the tests rather than the code: the
# canaries saw the runner report wrongly, the runner never finished a run it called a pass, the patch edited
# tests or what runs them or carried tamper code, or the agent's own tool calls broke an integrity rule
# (``integrity_violation:<rule>``). Counted per training step (``tamper_counts``) so that reward hacking shows
# while it starts; only ``runner_tampered`` has a price of its own (``train.reward.tampered``).
RUNNER_TAMPERED = "runner_tampered"
RUNNER_NOT_FINISHED = "runner_not_finished"
PROHIBITED_TEST_MODIFICATION = "prohibited_test_modification"
PROHIBITED_TEST_INFRASTRUCTURE = "prohibited_test_infrastructure"
SUSPICIOUS_TEST_TAMPERING = "suspicious_test_tampering"
INTEGRITY_VIOLATION = "integrity_violation"
TAMPER_REASONS = (
    RUNNER_TAMPERED,
    RUNNER_NOT_FINISHED,
    PROHIBITED_TEST_MODIFICATION,
    PROHIBITED_TEST_INFRASTRUCTURE,
    SUSPICIOUS_TEST_TAMPERING,
    INTEGRITY_VIOLATION,
)


def tamper_code(reason: str | None) -> str | None:
    """The tamper verdict a failure reason names (its code before any ``:``), or None for any other reason."""
    code = (reason or "").split(":", 1)[0]
    return code if code in TAMPER_REASONS else None


def tamper_counts(reasons: Iterable[str | None]) -> dict[str, int]:
    """Tamper verdicts among ``reasons`` by code, every code present (0 when absent), in ``TAMPER_REASONS``
    order; the total is their sum."""
    counts = dict.fromkeys(TAMPER_REASONS, 0)
    for reason in reasons:
        code = tamper_code(reason)
        if code is not None:
            counts[code] += 1
    return counts
