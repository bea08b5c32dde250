"""Regenerate the stored sample tasks (patches and metadata) from `taskdefs.TASKS`.

Run `python -m sweflow.sample.generate` after changing the sample history or a task definition. It measures
FAIL_TO_PASS / PASS_TO_PASS by running each task's tests before and after the fix (see above `build_task`)
and refuses to write when the measured FAIL_TO_PASS differs from the one the definition expects.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

from sweflow.errors import DatasetError
from sweflow.sample.repo import REPO_NAME, apply_patch, clone_at, git, materialize_repo
from sweflow.sample.taskdefs import TASKS, Edit, TaskDef
from sweflow.util import atomic_write, run_cmd, stable_json

TASKS_DIR = Path(__file__).parent / "tasks"
VERSION = "0.1"

_STATUS_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")


def _apply_edits(repo: Path, edits: tuple[Edit, ...], where: str) -> None:
    for rel, old, new in edits:
        path = repo / rel
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        if old is None:
            text = text + new
        else:
            if text.count(old) != 1:
                raise DatasetError(
                    f"edit anchor occurs {text.count(old)} times, expected once", file=rel, row=where
                )
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")


def diff_of_edits(repo: Path, edits: tuple[Edit, ...], where: str) -> str:
    """Apply edits to a clean checkout, return `git diff` of them and restore the checkout."""
    _apply_edits(repo, edits, where)
    git(repo, "add", "-A")
    patch = git(repo, "diff", "--cached", "--full-index", "--no-color", "--no-ext-diff", "--no-renames")
    git(repo, "reset", "-q", "--hard")
    return patch


def patched_files(patch: str) -> list[str]:
    """Paths a unified git diff touches (the `b/` side), in order."""
    return re.findall(r"^diff --git a/\S+ b/(\S+)$", patch, flags=re.M)


def pytest_log(repo: Path, test_files: list[str], timeout: float = 120) -> str:
    """Run `pytest -rA` on test files in `repo` with this interpreter; return its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # The sample needs plain pytest; skipping third-party plugins halves the start-up time.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *test_files]
    return run_cmd(cmd, cwd=repo, env=env, timeout=timeout).stdout


def parse_statuses(log: str) -> dict[str, str]:
    """{node id: status} from the short summary of a `pytest -rA` log."""
    out: dict[str, str] = {}
    for line in log.splitlines():
        m = _STATUS_LINE.match(line)
        if m:
            out[m.group(2)] = m.group(1)
    return out


def run_pytest(repo: Path, test_files: list[str], timeout: float = 120) -> dict[str, str]:
    """Run `pytest -rA` on test files in `repo`; return {node id: status}; error when no test was reported."""
    log = pytest_log(repo, test_files, timeout)
    out = parse_statuses(log)
    if not out:
        raise DatasetError(f"pytest reported no tests: {log[-500:]}", file=str(repo))
    return out


# For each task it clones the sample repository at the base commit, applies the edits, takes `git diff` as the
# patch, then runs pytest on the touched test files before and after the fix: FAIL_TO_PASS is what fails
# before and passes after, PASS_TO_PASS what passes both times. It refuses to write when the measured
# FAIL_TO_PASS differs from the one the definition expects.
def build_task(task: TaskDef, source: Path, commits: dict[str, str], work: Path) -> dict[str, object]:
    """Build one task's stored form: {"gold.patch": str, "test.patch": str, "meta.json": dict}."""
    repo = clone_at(source, work / task.instance_id, commits[task.base])
    gold = diff_of_edits(repo, task.gold, task.instance_id)
    test = diff_of_edits(repo, task.tests, task.instance_id)
    if any(p.startswith("tests/") for p in patched_files(gold)):
        raise DatasetError("gold patch touches tests", row=task.instance_id, field="patch")
    test_files = patched_files(test)
    if not test_files or not all(p.startswith("tests/") for p in test_files):
        raise DatasetError("test patch must touch only files under tests/", row=task.instance_id)
    if not apply_patch(repo, test):
        raise DatasetError("test patch does not apply", row=task.instance_id, field="test_patch")
    before = run_pytest(repo, test_files)
    if not apply_patch(repo, gold):
        raise DatasetError("gold patch does not apply", row=task.instance_id, field="patch")
    after = run_pytest(repo, test_files)
    f2p = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) != "PASSED")
    p2p = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) == "PASSED")
    broken = sorted(t for t, s in after.items() if s != "PASSED")
    if broken:
        raise DatasetError(f"tests fail with the gold patch: {broken}", row=task.instance_id)
    if f2p != sorted(task.fail_to_pass):
        raise DatasetError(
            f"measured FAIL_TO_PASS {f2p} != expected", row=task.instance_id, field="FAIL_TO_PASS"
        )
    if any(re.search(r"\s", t) for t in f2p + p2p):
        raise DatasetError(
            "a test id contains whitespace; the harness log parser cannot read it", row=task.instance_id
        )
    meta = {
        "instance_id": task.instance_id,
        "repo": REPO_NAME,
        "version": VERSION,
        "base_commit": commits[task.base],
        "base_name": task.base,
        "environment_setup_commit": commits[task.base],
        "created_at": task.created_at,
        "problem_statement": task.problem_statement,
        "hints_text": task.hints_text,
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
    }
    return {"gold.patch": gold, "test.patch": test, "meta.json": meta}


def build_all(work: Path) -> dict[str, dict[str, object]]:
    """Build every task in a scratch folder; instance_id -> stored form."""
    info = materialize_repo(work / "source")
    return {t.instance_id: build_task(t, info.path, info.commits, work) for t in TASKS}


def write_all(dest: Path = TASKS_DIR) -> list[str]:
    """Regenerate the stored tasks under `dest`; return the instance ids written."""
    with tempfile.TemporaryDirectory(prefix="calclib-gen-") as tmp:
        built = build_all(Path(tmp))
    for iid, parts in built.items():
        atomic_write(dest / iid / "gold.patch", str(parts["gold.patch"]))
        atomic_write(dest / iid / "test.patch", str(parts["test.patch"]))
        atomic_write(dest / iid / "meta.json", stable_json(parts["meta.json"]))
    return sorted(built)


if __name__ == "__main__":
    for name in write_all():
        print(name)
