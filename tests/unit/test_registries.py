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
