"""The memory-reading forger (issue 44's first family), graded in real Docker and local sandboxes: a patch that
only appends to ``calclib/__init__.py`` reads every process it can see (``/proc/<pid>/mem`` through its
maps, ``cmdline``, ``environ``) for the host script's test patch; the canaries are then the tests that are in
neither HEAD nor that patch, so it runs them honestly and no-ops every other test.

The host script's setup is sealed off (``harness.grader.sealed``): the tests' ancestors hold only the test
section, so the forger finds nothing, no-ops everything, and the canaries catch it (the patch check, which now names
``.runtest``, is off here: the canaries alone must hold). Before the seal it found
the test patch in the evaluating shell's memory and was paid 1.0 on every run (measured 2026-12-07).
"""

from __future__ import annotations

import pytest

from tests.fixtures.forgers import FAMILIES as FORGERS

try:  # the reward suite's sample task and providers, shared
    from tests.integration.test_attacks_reward import NO_TAMPER_SCAN, TASK, _evaluate, _init_with, env, task  # noqa: F401
except ModuleNotFoundError:  # pragma: no cover
    from test_attacks_reward import NO_TAMPER_SCAN, TASK, _evaluate, _init_with, env, task  # type: ignore[no-redef] # noqa: F401

pytestmark = [pytest.mark.integration]

LEAK = "SWEFLOW-MEMORY-FORGER"

MEMORY_FORGER = FORGERS["memory"]  # paths built at run time: no "/proc/<pid>/mem" literal for a text scan


def test_the_memory_forger_finds_no_test_patch_and_is_not_paid(env, task):
    for _ in range(2):
        res = _evaluate(env, task, _init_with(env, task, MEMORY_FORGER), rules=NO_TAMPER_SCAN)
        assert f"{LEAK} found=False" in res.log, res.output_tail[-2000:]
        assert (res.reward, res.resolved) == (0.0, False), res.output_tail[-1500:]
        assert res.failure_reason == "runner_tampered", res.failure_reason


def test_the_sealed_script_still_grades_the_gold_patch(env, task):
    res = _evaluate(env, task, task["patch"])
    assert (res.reward, res.failure_reason) == (1.0, None), res.output_tail[-1500:]
