"""`sealed`: the host script's test section runs in a fresh shell that replaces the setup's, so the tests'
ancestors hold neither the test patch nor the planted canaries (tests/integration/test_attacks_memory.py
shows the forger that read them from memory, in real sandboxes)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from sweflow.errors import EvalError
from sweflow.harness.grader import host_eval_script, sealed
from sweflow.harness.loader import TEST_EXIT_ECHO

START, END = ">>>>> Start Test Output", ">>>>> End Test Output"
SECRET = "SECRET-TEST-PATCH-LINE"


def script(test_cmd: str) -> str:
    return "\n".join([
        "#!/bin/bash", "set -uxo pipefail", "export ACTIVATED=yes", "cd /tmp",
        f"cat > /dev/null <<'EOF_1'\n{SECRET}\nEOF_1", f": '{START}'", test_cmd, TEST_EXIT_ECHO,
        f": '{END}'", "true reset",
    ])  # fmt: skip


def test_the_test_section_alone_reaches_the_new_shell():
    out = sealed(host_eval_script(script("pytest -rA")), START)
    head, run = out.split("{ set +x; } 2>/dev/null\n")
    assert run.startswith("exec bash --noprofile --norc -c ")
    tail = shlex.split(run)[5]
    assert SECRET not in tail and SECRET in head
    assert tail.startswith("set -uxo pipefail\n") and f": '{START}'" in tail and 'exit "${' in tail


def test_the_sealed_script_runs_with_the_setups_env_and_exit_status(tmp_path):
    """What the tests see: exported variables, the folder, the test's own exit status; the start marker
    once in the trace (not in the exec line); and no trace of the setup in their ancestors' command lines."""
    probe = 'echo "env=$ACTIVATED cwd=$(pwd)"; cat /proc/$PPID/cmdline | tr "\\0" " "; echo; exit 3'
    text = sealed(host_eval_script(script(probe)), START)
    (tmp_path / "s.sh").write_text(text)
    inner = f's=$(cat {tmp_path}/s.sh) && eval "$s"'
    res = subprocess.run(["bash", "-c", inner], capture_output=True, text=True, timeout=30)
    assert res.returncode == 3
    assert "env=yes cwd=/tmp" in res.stdout and SECRET not in res.stdout
    assert res.stderr.count(START) == 1 and SECRET not in res.stderr.split(START, 1)[1]


def test_a_script_without_its_start_line_is_refused():
    with pytest.raises(EvalError, match="start-of-test-output"):
        sealed("set -x\npytest\n", START, instance_id="r-1")
    assert sealed("pytest\n", None) == "pytest\n"  # a harness without markers runs as it is
