"""Git plumbing for synthesis: pinned git calls, checkouts, patches made and applied without a sandbox.

Every call runs with the sample's pinned environment (no user/system config, fixed identity, no hooks), so
commits made here (the bugged task states) have the same shas on every machine.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path

from ..errors import SmithError
from ..grading.integrity import DEFAULT_RULES
from ..grading.integrity import is_test_path as _is_test_path
from ..sample.repo import GIT_OPTIONS, git_env
from ..util import run_cmd


def run_git(
    repo: str | os.PathLike,
    *args: str,
    input: str | None = None,
    date: str | None = None,
    timeout: float = 120,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """One pinned git command in `repo` (`env`: extra variables, e.g. GIT_INDEX_FILE); raises SmithError
    naming the command when `check` and it fails."""
    res = run_cmd(
        ["git", *GIT_OPTIONS, *args],
        cwd=repo,
        env={**git_env(date), **(env or {})},
        input=input,
        timeout=timeout,
    )
    if check and res.returncode != 0:
        raise SmithError(
            f"git {' '.join(args[:2])} failed (exit {res.returncode}): {res.stderr.strip()[:300]}",
            file=str(repo),
        )
    return res


def git_out(repo: str | os.PathLike, *args: str, **kw) -> str:
    return run_git(repo, *args, **kw).stdout


def checkout(src: str | os.PathLike, commit: str, dest: str | os.PathLike) -> Path:
    """A working copy of `src` (a repository or a bare one) at `commit`, detached, without remotes."""
    dest = Path(dest).resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    src = os.path.abspath(src)
    run_git(dest.parent, "clone", "-q", "--no-checkout", "--no-hardlinks", src, str(dest), timeout=600)
    run_git(dest, "checkout", "-q", "--detach", commit)
    run_git(dest, "remote", "remove", "origin", check=False)
    return dest


# The SWE-smith test-file heuristic on top of the integrity rules' own: a name starting with `test`, a stem
# ending in `_test`, or a tests/test/testing/specs folder on the path; conftest.py is test infrastructure.
# (Upstream's "stem ends with test" would also take latest.py or contest.py.)
TEST_RULES = replace(
    DEFAULT_RULES,
    test_dir_names=(*DEFAULT_RULES.test_dir_names, "specs"),
    test_file_globs=(*DEFAULT_RULES.test_file_globs, "test*.py"),
)
is_test_path = functools.partial(_is_test_path, rules=TEST_RULES)


def tracked_files(tree: str | os.PathLike, commit: str = "HEAD") -> list[str]:
    return sorted(git_out(tree, "ls-tree", "-r", "--name-only", commit).splitlines())


def source_files(tree: str | os.PathLike, commit: str = "HEAD", *, suffix: str = ".py") -> list[str]:
    """Tracked non-test files with `suffix`, sorted."""
    return [f for f in tracked_files(tree, commit) if f.endswith(suffix) and not is_test_path(f)]


def _lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def file_patch(path: str, old: str, new: str, *, context: int = 3) -> str:
    """A `git apply`-able unified diff turning `old` into `new` at repository path `path` ('' if equal)."""
    if old == new:
        return ""
    body = list(
        difflib.unified_diff(_lines(old), _lines(new), f"a/{path}", f"b/{path}", n=context, lineterm="\n")
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(body)


def applies(tree: str | os.PathLike, patch: str, *, reverse: bool = False) -> bool:
    args = ["apply", "--check", "--whitespace=nowarn"] + (["-R"] if reverse else []) + ["-"]
    return run_git(tree, *args, input=patch, check=False).returncode == 0


def apply_diff(tree: str | os.PathLike, patch: str, *, reverse: bool = False) -> None:
    """`git apply` (binary-safe) in `tree`; raises SmithError when it does not apply."""
    args = ["apply", "--whitespace=nowarn", "--binary"] + (["-R"] if reverse else []) + ["-"]
    res = run_git(tree, *args, input=patch, check=False)
    if res.returncode != 0:
        raise SmithError(f"patch does not apply: {res.stderr.strip()[:300]}", file=str(tree))


def worktree_diff(tree: str | os.PathLike, *paths: str, base: str = "HEAD") -> str:
    """The working tree's changes against `base` (untracked files included) as a binary-safe git diff."""
    run_git(tree, "add", "-A", "--", *(paths or ["."]))
    out = git_out(
        tree,
        "-c",
        "core.quotepath=true",
        "diff",
        "--cached",
        "--binary",
        "--no-ext-diff",
        "--no-textconv",
        "--no-color",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        base,
        "--",
        *(paths or ["."]),
    )
    run_git(tree, "reset", "-q")
    return out


_DIFF_FILE_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)


def patch_files(patch: str) -> list[str]:
    """Repository paths a git diff touches (both sides of renames), sorted."""
    found: set[str] = set()
    for a, b in _DIFF_FILE_RE.findall(patch):
        found.update({a, b})
    return sorted(found)
