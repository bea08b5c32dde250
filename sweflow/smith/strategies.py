"""The bug strategies, one registered function each, picked by name (`STRATEGIES[name](shard)`).

Every function makes the candidates of one shard of one strategy from a checked-out reference tree and
returns (candidates, skipped items with their reasons).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SmithError
from .candidates import Candidate, shard_of

Result = tuple[list[Candidate], list[dict[str, Any]]]


# What a strategy needs beyond the tree comes in the `Shard`: its own options, the LM endpoint (opened by the
# caller, which records it) and, for `combine`, the candidates validation kept.
@dataclass(frozen=True)
class Shard:
    """One shard of one strategy's work."""

    strategy: str
    tree: Path
    files: Sequence[str]
    repo: str
    commit: str
    seed: int
    shard: int
    shards: int
    opts: Mapping[str, Any]
    open_lm: Callable[[], AbstractContextManager[Any]]  # LMSettings of smith.lm while open
    kept: Callable[[], list[dict[str, Any]]]  # the candidates validation kept (combine's input)


STRATEGIES: dict[str, Callable[[Shard], Result]] = {}


def strategy(*names: str) -> Callable[[Callable[[Shard], Result]], Callable[[Shard], Result]]:
    def register(fn: Callable[[Shard], Result]) -> Callable[[Shard], Result]:
        for name in names:
            STRATEGIES[name] = fn
        return fn

    return register


def candidates_of(s: Shard) -> Result:
    """The candidates of shard `s` by its strategy's registered function."""
    if s.strategy not in STRATEGIES:
        raise SmithError(f"unknown strategy {s.strategy!r}", field="strategy")
    return STRATEGIES[s.strategy](s)


@strategy("procedural")
def _procedural(s: Shard) -> Result:
    from .procedural import procedural_candidates

    cands = procedural_candidates(
        s.tree,
        s.files,
        repo=s.repo,
        commit=s.commit,
        seed=s.seed,
        shard=s.shard,
        shards=s.shards,
        modifiers=s.opts.get("modifiers"),
        per_entity=s.opts["per_entity"],
        min_complexity=s.opts["min_complexity"],
        max_candidates=s.opts.get("max_candidates"),
    )
    return cands, []


def request_failed(record: Mapping[str, Any]) -> bool:
    return str(record.get("reason", "")).startswith("request failed")


@strategy("lm_modify", "lm_rewrite")
def _lm(s: Shard) -> Result:
    from .lm_strategies import lm_candidates

    with s.open_lm() as settings:
        cands, skipped = lm_candidates(
            s.tree,
            s.files,
            repo=s.repo,
            commit=s.commit,
            strategy=s.strategy,
            settings=settings,
            seed=s.seed,
            shard=s.shard,
            shards=s.shards,
            max_candidates=s.opts.get("max_candidates"),
        )
    if skipped and not cands and all(request_failed(r) for r in skipped):
        # the endpoint answered nothing (down, refused the key): an infrastructure fault, not a yield of 0
        raise SmithError(f"every LM request failed; first: {skipped[0]['reason']}", field="smith.lm")
    return cands, skipped


@strategy("pr_mirror")
def _pr_mirror(s: Shard) -> Result:
    from .pr_mirror import lm_file_rewriter, pr_candidates

    with s.open_lm() as settings:
        return pr_candidates(
            s.tree,
            s.commit,
            repo=s.repo,
            shard=s.shard,
            shards=s.shards,
            limit=s.opts.get("max_commits"),
            rewrite=lm_file_rewriter(settings),
        )


@strategy("combine")
def _combine(s: Shard) -> Result:
    from .combine import combine_candidates

    def group(c: Mapping[str, Any]) -> str:
        # a shard holds whole groups: the file, or its folder when combining by module
        f = c["files"][0] if c["files"] else ""
        return f if s.opts["by"] == "file" else posixpath.dirname(f)

    kept = [c for c in s.kept() if shard_of(group(c), s.shards) == s.shard]
    return combine_candidates(
        kept,
        repo=s.repo,
        commit=s.commit,
        tree=s.tree,
        seed=s.seed,
        max_combos=s.opts["max_combos"],
        min_bugs=s.opts["min_bugs"],
        max_bugs=s.opts["max_bugs"],
        by=s.opts["by"],
    )
