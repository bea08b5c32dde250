"""The codes a fresh evaluation's verdict can carry beyond the harness's and the integrity rules' own.

One module for them: grading, validation, rollouts and the report name a reason by these constants.
"""

from __future__ import annotations

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
