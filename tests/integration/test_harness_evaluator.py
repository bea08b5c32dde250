"""The evaluator command end to end, in a bubblewrap sandbox shaped like a task image.

/testbed is a temp git repo (a tiny calclib), /opt/miniconda3/bin/activate is a shim whose `conda activate`
puts this test's Python (with pytest) on PATH, and nothing of sweflow is visible inside: the command must
unpack its own eval script and parser program and print the marker line.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sweflow.grading.reward import reward_from_output
from sweflow.harness import load_harness

pytestmark = pytest.mark.integration
pytest.importorskip("swebench", reason="swebench 4.x is the harness the tests run against")

CALCLIB = "sweflow/calclib"
ADD = "def add(a, b):\n    return a + b\n"
SUB = "\n\ndef sub(a, b):\n    return a - b\n"
TESTS = "import calclib\n\n\ndef test_add():\n    assert calclib.add(1, 2) == 3\n"
NEW_TEST = "\n\ndef test_sub():\n    assert calclib.sub(3, 1) == 2\n"
SLOW_TEST = "\n\ndef test_sub():\n    import time\n    time.sleep(60)\n"


def _bwrap_ok() -> bool:
    if not shutil.which("bwrap") or not Path("/usr/bin/python3").exists():
        return False
    probe = subprocess.run(
        ["bwrap", "--ro-bind", "/", "/", "--unshare-pid", "true"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


requires_bwrap = pytest.mark.skipif(
    not _bwrap_ok(), reason="bubblewrap (bwrap) and /usr/bin/python3 are needed"
)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout


def _make_task(tmp: Path, new_test: str) -> tuple[Path, dict]:
    repo = tmp / "testbed"
    (repo / "calclib").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calclib" / "__init__.py").write_text(ADD)
    (repo / "tests" / "test_ops.py").write_text(TESTS)
    (repo / "conftest.py").write_text("")  # puts /testbed on sys.path, as an installed package would be
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "tests" / "test_ops.py").write_text(TESTS + new_test)
    test_patch = _git(repo, "diff")
    _git(repo, "checkout", "-q", "--", "tests/test_ops.py")
    instance = {
        "instance_id": "sweflow__calclib-1",
        "repo": CALCLIB,
        "version": "0.1",
        "base_commit": base,
        "test_patch": test_patch,
        "problem_statement": "add sub()",
        "hints_text": "",
        "FAIL_TO_PASS": ["tests/test_ops.py::test_sub"],
        "PASS_TO_PASS": ["tests/test_ops.py::test_add"],
    }
    return repo, instance


def _conda_shim(tmp: Path) -> Path:
    root = tmp / "miniconda3"
    (root / "bin").mkdir(parents=True, exist_ok=True)
    venv_bin = Path(sys.executable).parent
    (root / "bin" / "activate").write_text(
        f'conda() {{ if [ "$1" = activate ]; then export PATH="{venv_bin}:$PATH"; fi; }}\n'
    )
    return root


def _run_in_sandbox(tmp: Path, repo: Path, command: str) -> subprocess.CompletedProcess:
    # the private /tmp comes first: a checkout (and its venv) under /tmp is bound on top of it, not hidden
    binds = ["--tmpfs", "/tmp", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for link in ("bin", "lib", "lib64", "sbin"):
        p = Path("/") / link
        if p.is_symlink():
            binds += ["--symlink", str(p.readlink()), str(p)]
        elif p.exists():
            binds += ["--ro-bind", str(p), str(p)]
    for extra in {sys.prefix, sys.base_prefix}:
        if not extra.startswith("/usr"):
            binds += ["--ro-bind", extra, extra]
    argv = [
        "bwrap",
        *binds,
        "--proc", "/proc",
        "--dev", "/dev",
        "--bind", str(repo), "/testbed",
        "--ro-bind", str(_conda_shim(tmp)), "/opt/miniconda3",
        "--unshare-net", "--unshare-pid", "--die-with-parent",
        "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp",
        "bash", "-c", command,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def harness():
    h = load_harness("swebench")
    h.register_repos(
        {CALCLIB: {"0.1": {"python": "3.11", "test_cmd": "pytest -rA"}}}, {CALCLIB: "parse_log_pytest"}
    )
    return h


@requires_bwrap
def test_gold_patch_resolves_and_empty_patch_does_not(harness, tmp_path):
    repo, instance = _make_task(tmp_path, NEW_TEST)
    command = harness.evaluator_command(instance, timeout_sec=120)

    unresolved = _run_in_sandbox(tmp_path, repo, command)
    res = reward_from_output(unresolved.stdout)
    assert res.failure_reason == "fail_to_pass_failure", (unresolved.stdout, unresolved.stderr)
    assert res.details["pass_to_pass_success"] == 1 and res.details["test_exit_code"] == 1

    with (repo / "calclib" / "__init__.py").open("a") as fh:  # the "agent's" fix, uncommitted
        fh.write(SUB)
    resolved = _run_in_sandbox(tmp_path, repo, command)
    res = reward_from_output(resolved.stdout)
    assert (res.reward, res.failure_reason) == (1.0, None), (resolved.stdout, resolved.stderr)
    assert res.details["eval_returncode"] == 0 and res.details["test_exit_code"] == 0
    assert res.details["parsed_tests"] == 2
    # The eval script restores the test files afterwards, as the official script does.
    assert (repo / "tests" / "test_ops.py").read_text() == TESTS
    assert len(resolved.stdout.strip().splitlines()) == 1


@requires_bwrap
def test_eval_timeout_is_reported(harness, tmp_path):
    repo, instance = _make_task(tmp_path, SLOW_TEST)
    proc = _run_in_sandbox(tmp_path, repo, harness.evaluator_command(instance, timeout_sec=3))
    res = reward_from_output(proc.stdout)
    assert (res.reward, res.failure_reason) == (0.0, "eval_timeout"), (proc.stdout, proc.stderr)
    assert res.details["eval_returncode"] == 124
