"""Combined bugs: several validated single-file bugs of one file (or one folder) applied together.

Members are grouped by their file (`by="file"`) or its parent folder (`by="module"`); within a group,
combinations of `min_bugs..max_bugs` members are drawn with a generator seeded by `seed` and the group, so
the same inputs always give the same combinations.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import SmithError
from ..schema import default
from .candidates import Candidate, make_candidate
from .gitrepo import apply_diff, checkout, git_out, patch_files, run_git, worktree_diff

_GROUPINGS = ("file", "module")
# Up to this many possible combinations in a group they are all listed and sampled without replacement;
# above it (and when that is more than twice max_combos) they are drawn one by one, repeats rejected.
_ENUMERATE_UP_TO = 4096


def _group_key(path: str, by: str) -> str:
    if by == "file":
        return path
    return str(PurePosixPath(path).parent)


def _groups(validated: Iterable[Mapping | Candidate], by: str) -> dict[str, dict[str, Mapping]]:
    """group -> {instance_id: candidate dict} for the single-file, non-combine candidates."""
    groups: dict[str, dict[str, Mapping]] = defaultdict(dict)
    for item in validated:
        d = item.to_dict() if isinstance(item, Candidate) else item
        files = list(d.get("files") or [])
        if d.get("strategy") == "combine" or len(files) != 1 or not d.get("patch"):
            continue
        groups[_group_key(files[0], by)].setdefault(d["instance_id"], d)
    return groups


def _draw(rng: random.Random, ids: list[str], lo: int, hi: int, max_combos: int) -> list[tuple[str, ...]]:
    """Up to `max_combos` distinct sorted combinations of lo..hi of `ids` (sorted), in draw order."""
    hi = min(hi, len(ids))
    if len(ids) < lo or max_combos <= 0:
        return []
    total = sum(math.comb(len(ids), k) for k in range(lo, hi + 1))
    if total <= max(_ENUMERATE_UP_TO, 2 * max_combos):
        every = [c for k in range(lo, hi + 1) for c in itertools.combinations(ids, k)]
        return rng.sample(every, min(max_combos, total))
    seen: set[tuple[str, ...]] = set()
    out: list[tuple[str, ...]] = []
    tries = 0
    while len(out) < max_combos and tries < 20 * max_combos:
        tries += 1
        combo = tuple(sorted(rng.sample(ids, rng.randint(lo, hi))))
        if combo not in seen:
            seen.add(combo)
            out.append(combo)
    return out


def _reset(work: Path) -> None:
    run_git(work, "reset", "-q", "--hard", "HEAD")
    run_git(work, "clean", "-fdq")


# A combination whose patches do not apply one after another at the reference commit is recorded as a
# conflict; the others become `combine` candidates whose patch is the joint diff. One checkout serves every
# combination (reset in between).
def combine_candidates(
    validated: Iterable[Mapping],
    *,
    repo: str,
    commit: str,
    tree: str | os.PathLike,
    seed: int,
    max_combos: int,
    min_bugs: int = default("smith.strategies.combine.min_bugs"),
    max_bugs: int = default("smith.strategies.combine.max_bugs"),
    by: str = default("smith.strategies.combine.by"),
) -> tuple[list[Candidate], list[dict[str, Any]]]:
    """Combine candidates (at most `max_combos` drawn per group) and `{"members", "reason"}` records of the
    combinations that were drawn but could not be made (reason "conflict", or "no_change")."""
    if by not in _GROUPINGS:
        raise SmithError(f"unknown grouping {by!r}", field="by", hint=f"one of {_GROUPINGS}")
    if min_bugs < 2 or max_bugs < min_bugs:
        raise SmithError(f"need 2 <= min_bugs <= max_bugs, got {min_bugs}..{max_bugs}", field="min_bugs")
    groups = _groups(validated, by)
    plans = []
    for group in sorted(groups):
        members = groups[group]
        combos = _draw(random.Random(f"{seed}:{group}"), sorted(members), min_bugs, max_bugs, max_combos)
        if combos:
            plans.append((group, members, combos))
    cands: list[Candidate] = []
    failed: list[dict[str, Any]] = []
    if not plans:
        return cands, failed
    ref = git_out(tree, "rev-parse", "--verify", f"{commit}^{{commit}}").strip()
    with tempfile.TemporaryDirectory(prefix="sweflow-combine-") as tmp:
        work = checkout(tree, ref, Path(tmp) / "work")
        for group, members, combos in plans:
            for combo in combos:
                ids = list(combo)
                try:
                    for mid in ids:
                        apply_diff(work, members[mid]["patch"])
                except SmithError:
                    failed.append({"members": ids, "reason": "conflict"})
                    _reset(work)
                    continue
                patch = worktree_diff(work)
                _reset(work)
                if not patch.strip():
                    failed.append({"members": ids, "reason": "no_change"})
                    continue
                parts = [(members[m].get("meta") or {}).get("explanation") or m for m in ids]
                cands.append(
                    make_candidate(
                        repo,
                        ref,
                        "combine",
                        patch,
                        patch_files(patch),
                        entity=group,
                        members=ids,
                        by=by,
                        explanation="combines " + "; ".join(parts),
                    )
                )
    return cands, failed
