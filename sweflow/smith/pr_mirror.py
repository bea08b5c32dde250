"""PR mirrors: a bug is a past commit's non-test change undone at the reference commit.

For each history commit C the "PR" is parent(C)..C; the mirror reverts the non-test files of C at the
reference commit (see above `pr_candidates`), so the tests C added or changed still check the feature and
now fail. Commits that cannot be mirrored are skipped with a `{"commit", "reason"}` record.
"""

from __future__ import annotations

import ast
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import SmithError
from ..schema import default
from .candidates import Candidate, make_candidate, shard_of
from .gitrepo import apply_diff, checkout, git_out, is_test_path, patch_files, run_git, worktree_diff

SKIP_LIMITS = {"max_files": 8, "max_lines": 500, "max_file_lines": 10000}

# rewrite(path, current_text, reverse_diff) -> the whole reverted file text, or None when it cannot.
Rewrite = Callable[[str, str, str], "str | None"]

_DIFF_ARGS = ("--no-renames", "--no-ext-diff", "--no-textconv", "--no-color")


def history_commits(tree: str | os.PathLike, commit: str, *, limit: int | None = None) -> list[str]:
    """Non-merge first-parent commits reachable from `commit` that have a parent, newest first."""
    out = git_out(tree, "rev-list", "--no-merges", "--first-parent", "--parents", commit, "--")
    shas = [line.split()[0] for line in out.splitlines() if len(line.split()) > 1]
    return shas if limit is None else shas[: max(limit, 0)]


def _resolve(tree: str | os.PathLike, commit: str) -> str:
    return git_out(tree, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").strip()


def _numstat(tree: str | os.PathLike, commit: str) -> list[tuple[str | None, str | None, str]]:
    """(added, deleted, path) per file of parent..commit; counts are None for a binary change."""
    out = git_out(tree, "diff", *_DIFF_ARGS, "--numstat", "-z", f"{commit}^", commit, "--")
    rows = []
    for entry in out.split("\0"):
        if not entry:
            continue
        added, deleted, path = entry.split("\t", 2)
        rows.append((None if added == "-" else added, None if deleted == "-" else deleted, path))
    return rows


def _statuses(tree: str | os.PathLike, commit: str) -> dict[str, str]:
    """path -> A/M/D/T for parent..commit."""
    parts = git_out(tree, "diff", *_DIFF_ARGS, "--name-status", "-z", f"{commit}^", commit, "--").split("\0")
    parts = [p for p in parts if p]
    return {parts[i + 1]: parts[i][0] for i in range(0, len(parts) - 1, 2)}


def _line_count(path: Path) -> int:
    if not path.is_file():
        return 0
    data = path.read_bytes()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


# Commits that are too big, binary, Python-free or cannot be reverted are skipped with a `{"commit",
# "reason"}` record (`"file"` too when one file could not be reverted).
def _skip_reason(rows, mirror: Path, limits: Mapping[str, int]) -> str | None:
    paths = [p for _, _, p in rows]
    if not any(p.endswith(".py") for p in paths):
        return "no_python"
    if len(paths) > limits["max_files"]:
        return "too_many_files"
    if sum(int(a or 0) + int(d or 0) for a, d, _ in rows) > limits["max_lines"]:
        return "too_many_lines"
    if any(_line_count(mirror / p) > limits["max_file_lines"] for p in paths):
        return "file_too_long"
    if any(a is None or d is None for a, d, _ in rows):
        return "binary"
    return None


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def _reset(mirror: Path) -> None:
    run_git(mirror, "reset", "-q", "--hard", "HEAD")
    run_git(mirror, "clean", "-fdq")


def _revert_file(
    tree: str | os.PathLike, mirror: Path, pr: str, path: str, status: str, rewrite: Rewrite | None
) -> tuple[bool, bool]:
    """Revert `path`'s part of `pr` in `mirror`: (done, rewritten)."""
    target = mirror / path
    if status == "A":
        if target.is_file() or target.is_symlink():
            target.unlink()
        return True, False
    reverse = git_out(
        tree, "diff", *_DIFF_ARGS, "--src-prefix=a/", "--dst-prefix=b/", pr, f"{pr}^", "--", path
    )
    try:
        apply_diff(mirror, reverse)
        return True, False
    except SmithError:
        pass
    if rewrite is None or not target.is_file():
        return False, False
    try:
        current = target.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return False, False
    try:
        new = rewrite(path, current, reverse)
    except SmithError:  # the LM request failed: skip the commit, as for any other failed rewrite
        return False, False
    if new is None or new == current or (path.endswith(".py") and not _parses(new)):
        return False, False
    with open(target, "w", encoding="utf-8", newline="") as fh:
        fh.write(new)
    return True, True


# For each history commit C the "PR" is parent(C)..C. The mirror starts at the reference commit and reverts
# the non-test files of C: a file C added is deleted; otherwise the reverse of C's diff for that file is
# applied, or, when later commits changed the file so it no longer applies, a `rewrite` callable (usually an
# LM) produces the reverted file; a rewrite that fails, changes nothing or does not parse drops the commit.
# Test files are never touched, so the tests C added or changed still check the feature and now fail.
def pr_candidates(
    tree: str | os.PathLike,
    commit: str,
    *,
    repo: str,
    shard: int = 0,
    shards: int = default("smith.strategies.pr_mirror.shards"),
    limit: int | None = None,
    rewrite: Rewrite | None = None,
    limits: Mapping[str, int] = SKIP_LIMITS,
) -> tuple[list[Candidate], list[dict[str, Any]]]:
    """PR-mirror candidates at `commit` for this shard's history commits, and the skipped commits.

    `limit` caps the history commits considered (newest first) before sharding, so the shards of one
    limit partition the same commits. `limits` overrides any of SKIP_LIMITS.
    """
    lim = {**SKIP_LIMITS, **limits}
    ref = _resolve(tree, commit)
    if not ref:
        raise SmithError(f"commit {commit!r} is not in the repository", field="commit", file=str(tree))
    mine = [c for c in history_commits(tree, ref, limit=limit) if shard_of(c, shards) == shard]
    cands: list[Candidate] = []
    skipped: list[dict[str, Any]] = []
    if not mine:
        return cands, skipped
    with tempfile.TemporaryDirectory(prefix="sweflow-pr-") as tmp:
        mirror = checkout(tree, ref, Path(tmp) / "mirror")
        for pr in mine:
            _reset(mirror)
            rows = _numstat(tree, pr)
            reason = _skip_reason(rows, mirror, lim)
            if reason:
                skipped.append({"commit": pr, "reason": reason})
                continue
            statuses = _statuses(tree, pr)
            rewritten, failed = [], None
            for path in sorted(p for _, _, p in rows if not is_test_path(p)):
                done, by_rewrite = _revert_file(tree, mirror, pr, path, statuses.get(path, "M"), rewrite)
                if not done:
                    failed = path
                    break
                if by_rewrite:
                    rewritten.append(path)
            if failed is not None:
                skipped.append({"commit": pr, "reason": "rewrite_failed", "file": failed})
                continue
            patch = worktree_diff(mirror)
            if not patch.strip():
                skipped.append({"commit": pr, "reason": "no_change"})
                continue
            subject = git_out(tree, "log", "-1", "--format=%s", pr, "--").strip()
            cands.append(
                make_candidate(
                    repo,
                    ref,
                    "pr_mirror",
                    patch,
                    patch_files(patch),
                    entity=f"commit {pr[:12]}",
                    pr=pr,
                    subject=subject,
                    rewritten=rewritten,
                    explanation=f"reverts the non-test changes of {pr[:12]}",
                )
            )
        _reset(mirror)
    return cands, skipped


def lm_file_rewriter(settings: Any) -> Rewrite:
    """A `rewrite` callable asking the LM (prompt `pr_rewrite`: $path, $file, $diff) for the reverted file.

    It gives up (None) on a file holding a ``` fence, which the prompt cannot quote, and on a reply without
    a code block; a lost final newline is restored.
    """
    from .lm import code_block, complete
    from .lm_strategies import LM_SYSTEM
    from .statements import render_prompt

    def _rewrite(path: str, current: str, reverse_diff: str) -> str | None:
        if "```" in current or "```" in reverse_diff:
            return None
        user = render_prompt(
            "pr_rewrite", path=path, file=current.rstrip("\n"), diff=reverse_diff.rstrip("\n")
        )
        new = code_block(complete(settings, LM_SYSTEM, user))
        if new is not None and current.endswith("\n") and not new.endswith("\n"):
            new += "\n"
        return new

    return _rewrite
