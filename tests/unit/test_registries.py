"""Registries where there are alternatives: bug strategies and training engines, one function per name."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweflow.config import schema
from sweflow.errors import SmithError
from sweflow.smith import candidates, strategies


def test_every_strategy_the_config_names_has_a_registered_function():
    configured = set(schema()["properties"]["smith"]["properties"]["strategies"]["properties"])
    assert set(strategies.STRATEGIES) == set(candidates.STRATEGIES) == configured
    # the two LM strategies share one function; the others have their own
    fns = strategies.STRATEGIES
    assert fns["lm_modify"] is fns["lm_rewrite"] and len(set(fns.values())) == 4


def test_an_unknown_strategy_is_one_error_naming_it():
    shard = strategies.Shard("typo", Path("."), [], "r", "c", 0, 0, 1, {}, open_lm=None, kept=list)
    with pytest.raises(SmithError, match="unknown strategy 'typo'"):
        strategies.candidates_of(shard)


def test_an_lm_strategy_whose_every_request_failed_is_an_infrastructure_fault(monkeypatch):
    import contextlib

    from sweflow.smith import lm_strategies

    monkeypatch.setattr(
        lm_strategies, "lm_candidates", lambda *a, **k: ([], [{"reason": "request failed: refused"}] * 2)
    )
    opened = []

    @contextlib.contextmanager
    def open_lm():
        opened.append(1)
        yield object()

    shard = strategies.Shard("lm_modify", Path("."), [], "r", "c", 0, 0, 1, {}, open_lm=open_lm, kept=list)
    with pytest.raises(SmithError, match="every LM request failed"):
        strategies.candidates_of(shard)
    assert opened == [1]


def test_every_engine_the_recipe_accepts_has_a_registered_function():
    from sweflow.train import engines, recipe

    assert set(engines.ENGINES) == set(recipe.ENGINES) == {"trl", "verl"}


def test_the_pass_rules_are_named_and_differ_where_upstream_does():
    from sweflow.grading.pass_rules import PASS_RULES, passes
    from sweflow.harness import driver
    from sweflow.smith import bug_validation

    assert set(PASS_RULES) == {"harness", "swesmith"}
    assert PASS_RULES["harness"] == set(driver.PASSING_STATUSES) == {"PASSED", "XFAIL"}
    assert [
        s for s in ("PASSED", "XFAIL", "XPASS", "SKIPPED", "FAILED", "ERROR", None) if passes("swesmith", s)
    ] == ["PASSED"]
    assert passes("harness", "XFAIL") and not passes("harness", None)
    assert bug_validation.RULE == "swesmith"
    # SWE-smith's classification follows its rule: an XFAIL under the bug is a FAIL_TO_PASS, not a pass
    got = bug_validation.classify(["t1", "t2", "t3"], [{"t1": "PASSED", "t2": "XFAIL"}] * 2)
    assert got == {"FAIL_TO_PASS": ["t2", "t3"], "PASS_TO_PASS": ["t1"], "flaky": []}
    with pytest.raises(ValueError, match="no pass rule"):
        passes("nose", "PASSED")
