"""Validated candidates -> SWE-bench rows, each bugged state a commit in a local bare repository.

Each kept candidate becomes a parentless commit of the bugged tree, without its FAIL_TO_PASS test files,
under `refs/heads/tasks/<instance_id>` of the local bare repository `tasks.git` (nothing goes to a hosting
service); see above `gather`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..sample.tasks import RAW_COLUMNS
from .candidates import Candidate
from .gitrepo import git_out, is_test_path, run_git, tracked_files
from .profile import RepoProfile

TASK_REF = "refs/heads/tasks/"
# The raw SWE-Gym row schema (the one the sample dataset and validate_split use).
ROW_COLUMNS = RAW_COLUMNS


def files_of_tests(tests: Iterable[str]) -> list[str]:
    """The files of pytest-style test ids (`path::name[param]`), sorted."""
    return sorted({t.split("::", 1)[0] for t in tests if "::" in t})


def _diff(tree: Path, a: str, b: str, paths: list[str]) -> str:
    if not paths:
        return ""
    return git_out(
        tree,
        "-c",
        "core.quotepath=true",
        "diff",
        "--binary",
        "--no-ext-diff",
        "--no-textconv",
        "--no-color",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        a,
        b,
        "--",
        *paths,
    )


# Per kept candidate, in one reused checkout of the reference commit: apply the bug, take the fix (the bug's
# reverse on the files it changed), delete the test files that hold a FAIL_TO_PASS test (the agent never sees
# them; the test patch brings them back at evaluation, as the recipe does), and commit that tree as a
# parentless commit (pinned identity, the reference commit's date) under `refs/heads/tasks/<instance_id>`. No
# commit is parent of another, so a task's repository holds nothing that shows the fix. Nothing goes to a
# hosting service: the refs are pushed to the local bare repository `tasks.git` in one go. The official eval
# script runs only the test patch's files, so a row's PASS_TO_PASS are the validated passes in those files.
def gather(
    profile: RepoProfile,
    bare: str | os.PathLike,
    commit: str,
    date: str,
    kept: Iterable[tuple[Candidate, Mapping[str, Any]]],
    tasks_git: str | os.PathLike,
    skipped: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Rows (ROW_COLUMNS + `bug_patch`, `strategy`, `meta`, `failing_output`) for each (candidate, kept report), and the
    bare repository `tasks_git` (replaced) holding one parentless commit per row. A candidate that cannot
    become a task (its FAIL_TO_PASS files cannot be hidden, its fix is empty) is appended to `skipped`
    with the reason; the others go on."""
    tasks_git = Path(tasks_git).resolve()
    bare = Path(bare).resolve()
    rows: list[dict[str, Any]] = []
    skipped = skipped if skipped is not None else []
    refs: list[str] = []
    with tempfile.TemporaryDirectory(prefix=".smith-gather-", dir=tasks_git.parent) as tmp:
        # plumbing on a scratch bare copy and a private index: no working tree to reset or scan per task
        # (a 2,000-file repository costs milliseconds per task, not seconds)
        tree = Path(tmp) / "scratch.git"
        run_git(Path(tmp), "clone", "-q", "--bare", "--no-hardlinks", str(bare), str(tree), timeout=900)
        (Path(tmp) / "nowork").mkdir()  # index-only commands still want a work tree; never written to
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_WORK_TREE": str(Path(tmp) / "nowork")}
        tracked = set(tracked_files(tree, commit))
        for cand, report in kept:
            run_git(tree, "read-tree", commit, env=index)
            res = run_git(tree, "apply", "--cached", "--binary", "--whitespace=nowarn", "-", input=cand.patch,
                          env=index, check=False)  # fmt: skip
            if res.returncode != 0:
                skipped.append({"instance_id": cand.instance_id, "reason": "does_not_apply"})
                continue
            f2p = list(report["FAIL_TO_PASS"])
            files = files_of_tests(f2p)
            hidden = [f for f in files if is_test_path(f) and f in tracked]
            if not files or hidden != files:
                # a test id without a file, a file that is not a test file (a doctest in the source), or
                # one that is not there: the task could not hide and restore its tests
                skipped.append(
                    {"instance_id": cand.instance_id, "reason": "fail_to_pass_files", "files": files}
                )
                continue
            run_git(tree, "update-index", "--force-remove", "--", *hidden, env=index)
            tree_sha = git_out(tree, "write-tree", env=index).strip()
            sha = git_out(
                tree, "commit-tree", tree_sha, "-m", f"{profile.repo}: task state", date=date
            ).strip()
            changed = [f for f in cand.files if not is_test_path(f)]
            fix = _diff(tree, sha, commit, changed)
            if not fix.strip():
                skipped.append({"instance_id": cand.instance_id, "reason": "empty_fix"})
                continue
            refs.append(f"update {TASK_REF}{cand.instance_id} {sha}\n")
            rows.append(
                {
                    "instance_id": cand.instance_id,
                    "hints_text": "",
                    "patch": fix,
                    "test_patch": _diff(tree, sha, commit, hidden),
                    "created_at": date,
                    "problem_statement": "",
                    "repo": profile.repo,
                    "base_commit": sha,
                    "version": profile.version,
                    # the official eval script runs the test patch's files only: the row's PASS_TO_PASS are
                    # the stable passes among them (the whole suite's count stays in `suite_p2p`)
                    "PASS_TO_PASS": [t for t in report["PASS_TO_PASS"] if t.split("::", 1)[0] in hidden],
                    "FAIL_TO_PASS": f2p,
                    "environment_setup_commit": commit,
                    "bug_patch": cand.patch,
                    "strategy": cand.strategy,
                    "meta": cand.meta,
                    "failing_output": str(report.get("failing_output") or ""),
                    "suite_p2p": len(report["PASS_TO_PASS"]),
                }
            )
        run_git(tree, "update-ref", "--stdin", input="".join(refs))
        part = Path(tmp) / "tasks.git"
        run_git(Path(tmp), "init", "-q", "--bare", "--template=", str(part))
        if rows:
            # one packing thread: the same tasks give the same pack, byte for byte
            run_git(
                tree,
                "-c",
                "pack.threads=1",
                "push",
                "-q",
                str(part),
                f"{TASK_REF}*:{TASK_REF}*",
                timeout=1800,
            )
        if tasks_git.exists():
            shutil.rmtree(tasks_git)
        os.replace(part, tasks_git)
    return rows


def task_repository(
    tasks_git: str | os.PathLike, instance_id: str, dest: str | os.PathLike
) -> tuple[Path, str]:
    """A repository at `dest` holding only the one task commit (none of the other tasks' objects, which
    would show this task's fix): (path, commit sha)."""
    dest = Path(dest)
    run_git(dest.parent, "init", "-q", "--template=", str(dest))
    ref = f"{TASK_REF}{instance_id}"
    run_git(dest, "fetch", "-q", "--no-tags", str(Path(tasks_git).resolve()), f"{ref}:{ref}", timeout=600)
    sha = git_out(dest, "rev-parse", ref).strip()
    return dest, sha
