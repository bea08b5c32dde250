"""Patch extraction and fresh evaluation against scripted fake sandboxes (no daemons)."""

from __future__ import annotations

import base64
import re
import shlex

import pytest

from sweflow.errors import EvalError, SandboxError
from sweflow.grading import fresh
from sweflow.grading.evaluate import (
    OUTPUT_TAIL_CHARS,
    EvalResult,
    PatchResult,
    check_patch,
    evaluate_patch,
    extract_patch,
    patch_paths,
)
from sweflow.grading.integrity import IntegrityRules
from sweflow.harness.driver import DEFAULT_REWARD_MARKER
from sweflow.harness.grader import HOST_SCRIPT
from sweflow.sample import sample_rows
from sweflow.sandbox.base import CommandResult
from sweflow.stages.data import harness_from_config

BASE = "a" * 40
SRC_PATCH = (
    "diff --git a/calclib/ops.py b/calclib/ops.py\n--- a/calclib/ops.py\n+++ b/calclib/ops.py\n"
    "@@ -1 +1 @@\n-x = 1\n+x = 2\n"
)
TEST_PATCH = (
    "diff --git a/tests/test_ops.py b/tests/test_ops.py\n--- a/tests/test_ops.py\n+++ b/tests/test_ops.py\n"
    "@@ -1 +1 @@\n-assert 0\n+assert 1\n"
)


PATCH_SEEN = "/tmp/.sweflow/patch.diff"  # what the fakes answer for the extracted diff


class FakeSandbox:
    """Answers commands from a list of (substring, CommandResult | Exception) rules; records everything."""

    def __init__(self, rules=(), files=None, log="", exit_code=0, timed_out=False, logged_error=None):
        self.id, self.template = "fake-1", "tpl"
        self.rules = list(rules)
        self.files = dict(files or {})
        self.cmds: list[str] = []
        self.written: dict[str, bytes] = {}
        self.logged: list[tuple[str, float, str | None]] = []
        self.log, self.exit_code, self.timed_out, self.logged_error = log, exit_code, timed_out, logged_error
        self.kill_count = 0

    def run(self, cmd, *, timeout, env=None, cwd=None):
        self.cmds.append(cmd)
        inline = re.search(r"printf %s ([A-Za-z0-9+/=]+) \| base64 -d > ([^\s;]+)", cmd)
        if inline:  # fresh.prepare sends a small patch inside its command
            self.written[inline.group(2)] = base64.b64decode(inline.group(1))
        for needle, answer in self.rules:
            if needle in cmd:
                if isinstance(answer, list):  # a sequence of answers, consumed in order
                    a = answer.pop(0) if len(answer) > 1 else answer[0]
                else:
                    a = answer
                if isinstance(a, Exception):
                    raise a
                return a
        if "/tmp/.sweflow-extract-" in cmd:  # extraction prints the size of the diff it wrote
            data = self.files.get(PATCH_SEEN, b"")
            return CommandResult(0, f"\n{len(data) if isinstance(data, bytes) else 100}\n", "")
        return CommandResult(0, "", "")

    def run_logged(self, cmd, log_path, *, timeout, env=None, cwd=None, max_bytes=None):
        """The provider's trusted channel: the scripted log lands in the host file, with the exit code."""
        self.logged.append((cmd, timeout, cwd))
        if self.logged_error:
            raise self.logged_error
        with open(log_path, "w", encoding="utf-8") as fh:
            fh.write(self.log)
        return CommandResult(self.exit_code, "", "", self.timed_out)

    def write_file(self, path, data, *, timeout=60):
        self.written[path] = data if isinstance(data, bytes) else data.encode()

    def read_file(self, path, *, timeout=60):
        if path.startswith("/tmp/.sweflow-extract-") and path.endswith("/patch.diff"):
            path = PATCH_SEEN  # the extraction's own folder, named at random
        if path == "/tmp/.sweflow/fresh.diff" and path not in self.files:
            return self.written.get("/tmp/.sweflow/patch.diff", b"")  # the applied tree shows the patch
        data = self.files.get(path)
        if isinstance(data, list):
            data = data.pop(0) if len(data) > 1 else data[0]
        if isinstance(data, Exception):
            raise data
        if data is None and path.startswith("/tmp/.sweflow/read-"):
            return b""  # fresh._read_many: no file it asked for is there (no canary source)
        if data is None:
            raise SandboxError("read_file: no such file", file=path)
        return data

    def kill(self):
        self.kill_count += 1


class FakeProvider:
    name = "fake"

    def __init__(self, sb: FakeSandbox | Exception):
        self.sb = sb
        self.created: list[dict] = []

    def create(self, template, *, timeout, env=None, metadata=None, **kw):
        self.created.append(
            {"template": template, "timeout": timeout, "env": env, "metadata": metadata, **kw}
        )
        if isinstance(self.sb, Exception):
            raise self.sb
        return self.sb


HARNESS = harness_from_config("swebench", "sample")
INST = sample_rows("train")[0]
F2P, P2P = list(INST["FAIL_TO_PASS"]), list(INST["PASS_TO_PASS"])
META = {
    "instance_id": INST["instance_id"],
    "repo": INST["repo"],
    "version": INST["version"],
    "base_commit": BASE,
    "workdir": "/testbed",
    "FAIL_TO_PASS": F2P,
    "PASS_TO_PASS": P2P,
    "harness": {"package": "swebench", "parser": "parse_log_pytest"},
    "reward_marker": DEFAULT_REWARD_MARKER,
    "blackbox_execute_cmds": {
        "before_agent": [{"name": "git_sanitizer", "cmd": "sanitize", "required": True, "timeout": 120}],
        "after_agent": [
            {
                "name": "harness_eval",
                "cmd": HARNESS.evaluator_command(INST),
                "required": True,
                "timeout": 1260,
            }
        ],
    },
}
START, END = HARNESS.start_marker, HARNESS.end_marker


def pytest_log(statuses: dict[str, str], *, extra: str = "") -> str:
    """A log shaped like the official eval script's output under `pytest -rA`."""
    body = "".join(f"{st} {t}\n" for t, st in statuses.items())
    counts = ", ".join(
        f"{n} {st.lower()}" for st in ("FAILED", "PASSED") if (n := list(statuses.values()).count(st))
    )
    tail = f"=== {counts} in 0.42s ===\n"
    return f"+ : '{START}'\n+ pytest -rA\n=== short test summary info ===\n{body}{tail}{extra}+ : '{END}'\n"


ALL_PASS = dict.fromkeys(F2P + P2P, "PASSED")
F2P_FAIL = {**ALL_PASS, F2P[0]: "FAILED"}


# ----- patch paths and checks -----------------------------------------------------------------------------
def test_patch_paths_cover_renames_quoted_and_binary_headers():
    patch = (
        SRC_PATCH
        + "diff --git a/old/name.py b/tests/moved.py\nsimilarity index 100%\nrename from old/name.py\n"
        "rename to tests/moved.py\n"
        'diff --git "a/d\\303\\251j\\303\\240.py" "b/d\\303\\251j\\303\\240.py"\n--- "a/d\\303\\251j\\303\\240.py"\n'
        '+++ "b/d\\303\\251j\\303\\240.py"\n'
        "diff --git a/img.png b/img.png\nGIT binary patch\nliteral 3\nabc\n"
        "diff --git a/gone.py b/gone.py\ndeleted file mode 100644\n--- a/gone.py\n+++ /dev/null\n"
    )
    assert patch_paths(patch) == [
        "calclib/ops.py",
        "déjà.py",
        "gone.py",
        "img.png",
        "old/name.py",
        "tests/moved.py",
    ]


@pytest.mark.parametrize(
    ("patch", "reason", "tests"),
    [
        ("", "empty_generation", []),
        ("  \n", "empty_generation", []),
        (SRC_PATCH, None, []),
        (SRC_PATCH + TEST_PATCH, "prohibited_test_modification", ["tests/test_ops.py"]),
        (SRC_PATCH.replace("calclib/ops.py", "conftest.py"), "prohibited_test_modification", ["conftest.py"]),
    ],
)
def test_check_patch(patch, reason, tests):
    assert check_patch(patch) == (reason, tests)


# ----- extract_patch ---------------------------------------------------------------------------------------
def test_extract_patch_reads_the_diff_from_a_file_and_runs_git_add_and_binary_diff():
    big = SRC_PATCH + "+" + "x" * 200_000 + "\n"  # beyond any stdout tail: must come through read_file
    sb = FakeSandbox(files={"/tmp/.sweflow/patch.diff": big.encode()})
    got = extract_patch(sb, BASE, workdir="/work dir")
    assert got == PatchResult(big, None, [])
    [cmd] = sb.cmds
    assert re.match(
        r"mkdir -m 700 (/tmp/\.sweflow-extract-[0-9a-f]{32}) && cd '/work dir' && export GIT_INDEX_FILE=\1/",
        cmd,
    )
    assert (
        " && git -c core.fsmonitor=false -c core.hooksPath=/dev/null add -A && git -c core.quotepath=true"
        in cmd
    )
    assert f"--src-prefix=a/ --dst-prefix=b/ --cached --binary {BASE} >" in cmd and "--no-ext-diff" in cmd


def test_extract_patch_flags_empty_and_test_edits():
    sb = FakeSandbox(files={"/tmp/.sweflow/patch.diff": b""})
    assert extract_patch(sb, BASE).failure_reason == "empty_generation"
    sb = FakeSandbox(files={"/tmp/.sweflow/patch.diff": (SRC_PATCH + TEST_PATCH).encode()})
    got = extract_patch(sb, BASE)
    assert (got.failure_reason, got.test_files) == ("prohibited_test_modification", ["tests/test_ops.py"])
    assert got.patch == SRC_PATCH + TEST_PATCH


def test_extract_patch_retries_transient_provider_errors(monkeypatch):
    monkeypatch.setattr("sweflow.util.time.sleep", lambda s: None)
    sb = FakeSandbox(
        rules=[
            ("add -A", [SandboxError("exec create timed out"), CommandResult(0, f"\n{len(SRC_PATCH)}\n", "")])
        ],
        files={"/tmp/.sweflow/patch.diff": [SandboxError("read hiccup"), SRC_PATCH.encode()]},
    )
    got = extract_patch(sb, BASE, attempts=3)
    assert got.failure_reason is None and got.patch == SRC_PATCH and len(sb.cmds) == 3


def test_extract_patch_gives_up_with_a_reason(monkeypatch):
    monkeypatch.setattr("sweflow.util.time.sleep", lambda s: None)
    sb = FakeSandbox(rules=[("add -A", SandboxError("sandbox is gone"))])
    got = extract_patch(sb, BASE, attempts=2)
    assert got.failure_reason == "patch_extraction_failed" and "sandbox is gone" in got.error
    assert len(sb.cmds) == 2


def test_git_failing_in_a_live_sandbox_is_the_agents_doing():
    """A broken .git, a blocked path: not retried, and patch_unextractable (graded 0), not infrastructure."""
    sb = FakeSandbox(rules=[("add -A", CommandResult(128, "", "fatal: bad revision"))])
    got = extract_patch(sb, BASE, attempts=2)
    assert got.failure_reason == "patch_unextractable" and "bad revision" in got.error
    assert len(sb.cmds) == 1, "a git error is not retried"
    sb = FakeSandbox(rules=[("add -A", CommandResult(0, "forged output\n", ""))])
    assert extract_patch(sb, BASE).failure_reason == "patch_unextractable"


def test_a_patch_over_the_cap_is_never_read():
    unread = {PATCH_SEEN: SandboxError("read although over the cap")}
    sb = FakeSandbox(rules=[("add -A", CommandResult(0, "\n2000001\n", ""))], files=unread)
    got = extract_patch(sb, BASE)
    assert (got.patch, got.failure_reason) == ("", "patch_too_large")
    small = IntegrityRules(max_patch_bytes=10)
    sb = FakeSandbox(files={PATCH_SEEN: SRC_PATCH.encode()})
    assert extract_patch(sb, BASE, rules=small).failure_reason == "patch_too_large"


def test_non_utf8_patch_bytes_survive_the_round_trip():
    raw = SRC_PATCH.encode() + b"+caf\xe9\n"
    sb = FakeSandbox(files={"/tmp/.sweflow/patch.diff": raw})
    got = extract_patch(sb, BASE)
    sb2 = FakeSandbox(log=pytest_log(ALL_PASS))
    evaluate_patch(FakeProvider(sb2), "tpl", META, got.patch)
    assert sb2.written["/tmp/.sweflow/patch.diff"] == raw


# ----- evaluate_patch --------------------------------------------------------------------------------------
def test_resolved_run_resets_applies_runs_the_official_script_and_grades_on_the_host():
    sb = FakeSandbox(log="noise\n" + pytest_log(ALL_PASS))
    prov = FakeProvider(sb)
    res = evaluate_patch(prov, "tpl-x", META, SRC_PATCH, env={"A": "1"})
    assert (res.reward, res.resolved, res.failure_reason, res.error) == (1.0, True, None, None)
    assert res.marker["fail_to_pass_success"] == len(F2P) and res.marker["test_exit_code"] == 0
    assert "noise" in res.output_tail
    assert prov.created[0]["template"] == "tpl-x" and prov.created[0]["env"] == {"A": "1"}
    assert prov.created[0]["metadata"]["instance_id"] == INST["instance_id"]
    # one command resets, lists the ignored files, writes the patch and applies it
    assert f"git reset -q --hard {BASE}" in sb.cmds[0] and "git clean -fdq" in sb.cmds[0]
    assert "git ls-files -z --others --ignored" in sb.cmds[0] and "git apply --binary" in sb.cmds[0]
    assert sb.cmds[0].index("git reset") < sb.cmds[0].index("ls-files") < sb.cmds[0].index("git apply")
    # the canaries' source files are read at the base by that same command, before the apply: no command
    # of its own reads them
    assert (
        sb.cmds[0].index("git reset")
        < sb.cmds[0].index(f"git show {BASE}:tests/")
        < sb.cmds[0].index("git apply")
    )
    assert not any("git show" in c for c in sb.cmds[1:])
    assert sb.written["/tmp/.sweflow/patch.diff"] == SRC_PATCH.encode()
    script = sb.written[HOST_SCRIPT].decode()
    assert "git apply -v - <<'EOF_" in script, "the official script, test patch included"
    assert "SWEFLOW_TEST_EXIT_CODE" not in script
    # the test section runs in a shell that replaces the setup's (`sealed`), ending with the test's status
    setup, run = script.split("{ set +x; } 2>/dev/null\n")
    assert "git apply" in setup and run.startswith("exec bash --noprofile --norc -c ")
    assert shlex.split(run)[5].endswith('exit "${sweflow_test_rc:-1}"\n') and "git apply" not in run
    [(cmd, timeout, cwd)] = sb.logged
    assert cmd.startswith("timeout -k 30 1200 bash -c ") and "rm -f /tmp/.sweflow/host-eval.sh" in cmd
    assert cwd == "/testbed" and 1200 < timeout <= 1260 + 120
    assert sb.kill_count == 1
    assert {"create_s", "setup_s", "eval_s", "kill_s", "total_s"} <= set(res.timings)
    assert EvalResult(**res.to_dict(), log=res.log) == res
    assert res.log.startswith("noise\n") and res.statuses == ALL_PASS and res.exit_code == 0


def test_empty_patch_skips_apply_and_grades_the_base():
    sb = FakeSandbox(log=pytest_log(F2P_FAIL), exit_code=1)
    res = evaluate_patch(FakeProvider(sb), "tpl", META, "")
    assert (res.reward, res.resolved, res.failure_reason) == (0.0, False, "fail_to_pass_failure")
    assert not any("git apply" in c for c in sb.cmds) and "/tmp/.sweflow/patch.diff" not in sb.written


def test_failed_apply():
    sb = FakeSandbox(rules=[("git apply", CommandResult(1, "", "error: patch failed: calclib/ops.py:1"))])
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert (res.reward, res.failure_reason) == (0.0, "failed_apply_patch")
    assert "patch failed: calclib/ops.py:1" in res.output_tail
    assert sb.logged == [] and sb.kill_count == 1


@pytest.mark.parametrize(
    ("log", "exit_code", "reason"),
    [
        # The in-sandbox reward marker is just text now: it never decides anything.
        (
            pytest_log(F2P_FAIL, extra=DEFAULT_REWARD_MARKER + '{"resolved": true}\n'),
            1,
            "fail_to_pass_failure",
        ),
        (DEFAULT_REWARD_MARKER + '{"resolved": true, "failure_reason": null}\n', 0, "missing_test_markers"),
        # Forged PASSED lines: the test command's own status (from the provider) says it failed.
        (pytest_log(ALL_PASS), 1, "log_contradicts_exit_code"),
        # An exit-code line printed by the tested code is ignored: the provider's status counts.
        (pytest_log(ALL_PASS, extra="SWEFLOW_TEST_EXIT_CODE=0\n"), 2, "log_contradicts_exit_code"),
        # The real FAILED line followed by a forged PASSED line for the same test.
        (pytest_log(F2P_FAIL, extra=f"PASSED {F2P[0]}\n"), 1, "log_contradicts_exit_code"),
        # A required test reported passing twice: a runner reports each test once.
        (pytest_log(ALL_PASS, extra=f"PASSED {P2P[0]}\n"), 0, "duplicate_status_lines"),
        (pytest_log({}), 5, "no_tests_parsed"),
        (pytest_log(ALL_PASS), 124, "eval_timeout"),
        (pytest_log(ALL_PASS), 137, "eval_timeout"),
    ],
)
def test_host_grade_resists_forged_output(log, exit_code, reason):
    sb = FakeSandbox(log=log, exit_code=exit_code)
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert (res.reward, res.resolved, res.failure_reason) == (0.0, False, reason)


def test_unknown_parser_is_missing_parser():
    meta = {**META, "harness": {"package": "swebench", "parser": "parse_log_nonexistent"}}
    res = evaluate_patch(FakeProvider(FakeSandbox(log=pytest_log(ALL_PASS))), "tpl", meta, SRC_PATCH)
    assert (res.reward, res.failure_reason) == (0.0, "missing_parser")


CONFTEST = SRC_PATCH.replace("calclib/ops.py", "calclib/conftest.py")


@pytest.mark.parametrize(
    ("patch", "reason", "rule"),
    [
        (CONFTEST, "prohibited_test_modification", "test_file"),
        (
            SRC_PATCH.replace("calclib/ops.py", "sitecustomize.py"),
            "prohibited_test_infrastructure",
            "test_infrastructure",
        ),
        (
            SRC_PATCH.replace("calclib/ops.py", "calclib/hook.pth"),
            "prohibited_test_infrastructure",
            "test_infrastructure",
        ),
        (SRC_PATCH.replace("+x = 2", "+import _pytest.runner"), "suspicious_test_tampering", "tamper_code"),
        (
            SRC_PATCH.replace("+x = 2", "+os.write(1, b'PASSED x'); os._exit(0)"),
            "suspicious_test_tampering",
            "tamper_code",
        ),
        (SRC_PATCH + TEST_PATCH, "prohibited_test_modification", "test_file"),
    ],
)
def test_refused_patches_never_reach_a_sandbox(patch, reason, rule):
    prov = FakeProvider(FakeSandbox(log=pytest_log(ALL_PASS)))
    res = evaluate_patch(prov, "tpl", META, patch)
    assert (res.reward, res.resolved, res.failure_reason) == (0.0, False, reason)
    assert res.violations[0]["rule"] == rule and prov.created == []


def test_provider_errors_become_fresh_eval_exception():
    res = evaluate_patch(
        FakeProvider(SandboxError("template image not found", file="tpl")), "tpl", META, SRC_PATCH
    )
    assert (res.reward, res.failure_reason) == (0.0, "fresh_eval_exception")
    assert res.error == "SandboxError: tpl: template image not found"
    sb = FakeSandbox(rules=[("git reset", SandboxError("exec create timed out after 60s"))])
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert res.failure_reason == "fresh_eval_exception" and "exec create timed out" in res.error
    assert sb.kill_count == 1
    # the shell's answer when the reset before the apply fails (tests/integration/test_evaluate_sandbox.py)
    failed = CommandResult(fresh.SETUP_FAILED, "", f"fatal: unknown revision\n{fresh.SETUP_MARK}\n")
    sb = FakeSandbox(rules=[("git reset", failed)])
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert res.failure_reason == "fresh_eval_exception" and "unknown revision" in res.error
    sb = FakeSandbox(rules=[("git reset", CommandResult(128, "", "fatal: unknown revision"))])
    res = evaluate_patch(FakeProvider(sb), "tpl", META, "")
    assert res.failure_reason == "fresh_eval_exception" and "unknown revision" in res.error
    sb = FakeSandbox(logged_error=SandboxError("exec stream broke"))
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert res.failure_reason == "fresh_eval_exception" and sb.kill_count == 1


def test_deadline_bounds_the_run_and_a_timed_out_run_is_fresh_eval_timeout():
    import time

    sb = FakeSandbox(log="", exit_code=124, timed_out=True)
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH, deadline=time.monotonic() + 5)
    assert (res.reward, res.failure_reason) == (0.0, "fresh_eval_timeout")
    assert sb.logged[0][1] <= 5 and sb.kill_count == 1
    sb = FakeSandbox(log=pytest_log(ALL_PASS))
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH, deadline=time.monotonic() - 1)
    assert res.failure_reason == "fresh_eval_timeout" and sb.logged == []


def test_a_truncated_log_is_never_resolved():
    from sweflow.sandbox.logged import TRUNCATED_NOTE

    sb = FakeSandbox(log=pytest_log(ALL_PASS) + TRUNCATED_NOTE.decode())
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert (res.reward, res.failure_reason) == (0.0, "log_truncated")


def test_the_applied_tree_is_checked_again_as_text():
    """The agent's diff showed a harmless file; the fresh sandbox's own diff shows a conftest."""
    hidden = SRC_PATCH.replace("calclib/ops.py", "conftest.py")
    sb = FakeSandbox(log=pytest_log(ALL_PASS), files={"/tmp/.sweflow/fresh.diff": hidden.encode()})
    prov = FakeProvider(sb)
    res = evaluate_patch(prov, "tpl", META, SRC_PATCH)
    assert (res.reward, res.failure_reason) == (0.0, "prohibited_test_modification")
    assert any("--cached --text" in c for c in sb.cmds) and sb.logged == [] and sb.kill_count == 1


def test_output_tail_is_bounded():
    sb = FakeSandbox(log="x" * 100_000 + "\n" + pytest_log(ALL_PASS))
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert res.resolved and len(res.output_tail) == OUTPUT_TAIL_CHARS


def test_row_without_evaluator_is_a_caller_error():
    meta = {**META, "blackbox_execute_cmds": {"before_agent": [], "after_agent": []}}
    prov = FakeProvider(FakeSandbox())
    with pytest.raises(EvalError, match="no after-agent evaluator"):
        evaluate_patch(prov, "tpl", meta, SRC_PATCH)
    assert prov.created == []


# ----- infrastructure failures, network, evidence -----------------------------------------------------------
def test_a_process_killed_from_outside_or_a_dead_sandbox_is_infrastructure_not_a_grade():
    for sb in (
        FakeSandbox(log=pytest_log(ALL_PASS)[:40], exit_code=-9),  # the provider's process got SIGKILL
        FakeSandbox(log=pytest_log(ALL_PASS), exit_code=137, rules=[("sweflow-alive", SandboxError("gone"))]),
        FakeSandbox(
            log="", exit_code=1, rules=[("sweflow-alive", CommandResult(126, "", "container not running"))]
        ),
    ):
        res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
        assert (res.failure_reason, res.infra, res.reward, res.marker) == ("sandbox_lost", True, 0.0, None)
        assert res.error and res.log == sb.log and sb.kill_count == 1
    sb = FakeSandbox(log=pytest_log(ALL_PASS))
    sb.killed = True  # the sandbox's lifetime ran out (or someone killed it) while the script ran
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert res.failure_reason == "sandbox_lost" and "killed during the evaluation" in res.error


def test_the_test_command_timing_out_in_a_live_sandbox_is_a_grade():
    res = evaluate_patch(
        FakeProvider(FakeSandbox(log=pytest_log(ALL_PASS), exit_code=137)), "tpl", META, SRC_PATCH
    )
    assert (res.failure_reason, res.infra, res.error) == ("eval_timeout", False, None)


def test_a_log_without_the_start_marker_is_eval_not_run_for_trusted_patches_only():
    log = "+ cd /testbed\n+ git status\n"  # the script ended before the test command
    res = evaluate_patch(
        FakeProvider(FakeSandbox(log=log, exit_code=2)), "tpl", META, SRC_PATCH, trusted_patch=True
    )
    assert (res.failure_reason, res.infra) == ("eval_not_run", True) and "no '>>>>> Start" in res.error
    # An agent's patch may run code before the tests (a reinstall): its log is graded, reward 0.
    res = evaluate_patch(FakeProvider(FakeSandbox(log=log, exit_code=2)), "tpl", META, SRC_PATCH)
    assert (res.failure_reason, res.infra, res.reward) == ("missing_test_markers", False, 0.0)


def test_git_apply_cut_short_by_a_dead_sandbox_is_not_failed_apply_patch():
    sb = FakeSandbox(
        rules=[("git apply", CommandResult(-9, "", "")), ("sweflow-alive", SandboxError("gone"))]
    )
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert (res.failure_reason, res.infra) == ("fresh_eval_exception", True) and "git apply" in res.error


def test_network_reaches_create_only_when_given():
    prov = FakeProvider(FakeSandbox(log=pytest_log(ALL_PASS)))
    evaluate_patch(prov, "tpl", META, SRC_PATCH)
    assert "network" not in prov.created[0]
    prov = FakeProvider(FakeSandbox(log=pytest_log(ALL_PASS)))
    evaluate_patch(prov, "tpl", META, SRC_PATCH, network="internet")
    assert prov.created[0]["network"] == "internet"


def test_eval_network_per_repository():
    from sweflow.grading.evaluate import eval_network
    from sweflow.sandbox.settings import NetworkSettings

    net = NetworkSettings.from_config
    cfg = net({"eval": "none", "eval_repos": {"pydicom/pydicom": "internet"}})
    assert eval_network(cfg, "pydicom/pydicom") == "internet"
    assert eval_network(cfg, "PyDicom/pydicom") == "internet"
    assert eval_network(cfg, "getmoto/moto") == "none"
    assert eval_network(net({}), "getmoto/moto") == eval_network(None, "x/y") == "none"
    assert eval_network(net({"eval": "internet", "eval_repos": {"x/y": "none"}}), "x/y") == "none"
    with pytest.raises(EvalError, match="unknown evaluation network 'bridge'"):
        eval_network(net({"eval": "bridge"}), "x/y")


def test_evidence_is_byte_stable_gzip_with_the_whole_log_and_status_map(tmp_path):
    from sweflow.grading.evidence import evidence_record, read_evidence, write_evidence

    log = "noise\n" + "x" * 10_000 + "\n" + pytest_log(F2P_FAIL)
    res = evaluate_patch(FakeProvider(FakeSandbox(log=log, exit_code=1)), "tpl", META, SRC_PATCH)
    assert res.log == log
    res.log = log = "a non-UTF-8 byte: \udcff\n" + log  # as _read_log decodes one (surrogateescape)
    recs = [evidence_record(res, patch="gold", run=0, attempt=1)]
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    write_evidence(a, recs)
    write_evidence(b, recs)
    raw = a.read_bytes()
    assert raw == b.read_bytes() and raw[:2] == b"\x1f\x8b"
    assert raw[3] & 0x08 == 0 and raw[4:8] == b"\0\0\0\0", "no file name, mtime 0"
    [back] = read_evidence(a)
    assert back["log"] == log and back["statuses"] == F2P_FAIL and back["exit_code"] == 1
    assert (back["patch"], back["failure_reason"]) == ("gold", "fail_to_pass_failure")


def test_docker_network_reaches_docker_run_and_none_stays_the_default():
    """The argv side of the Docker provider's network option (this host's dockerd has no bridge)."""
    import types

    from sweflow.sandbox import docker as dk

    seen: list[dict] = []

    class Containers:
        def run(self, **kw):
            seen.append(kw)
            raise RuntimeError("stop here: the argv is what this test checks")

    img = types.SimpleNamespace(attrs={"Config": {"Cmd": None}})
    prov = object.__new__(dk.DockerProvider)
    prov.__dict__.update(
        cpu=None, memory_mb=None, pids_limit=None, cap_add=[], start_server=False, internet_network="evalnet",
        file_size_mb=None, scratch_mb=None, disk_mb=None, _disk_opt_ok=None,
        client=types.SimpleNamespace(images=types.SimpleNamespace(get=lambda t: img), containers=Containers()),
    )  # fmt: skip
    for network, mode in ((None, "none"), ("none", "none"), ("internet", "evalnet")):
        with pytest.raises(SandboxError):
            prov.create("tpl", timeout=60, network=network)
        assert seen[-1]["network_mode"] == mode
    with pytest.raises(SandboxError, match="fresh evaluations only"):
        dk.docker_network_mode("internet", "bridge", server=True, egress=None)
    with pytest.raises(SandboxError, match="unknown network"):
        dk.docker_network_mode("host", "bridge", server=False, egress=None)


def test_e2b_network_becomes_allow_internet_access(monkeypatch):
    """e2b 2.6x: Sandbox.create(allow_internet_access=...); agent sandboxes (no network) keep the default."""
    from sweflow.sandbox import e2b as e2

    calls: list[dict] = []

    class Sdk:
        @staticmethod
        def create(**kw):
            calls.append(kw)
            raise SandboxError("stop here")

    monkeypatch.setattr(e2, "SdkSandbox", Sdk)
    prov = e2.E2BProvider(api_key="e2b_test", attempts=1)
    for network in (None, "none", "internet"):
        with pytest.raises(SandboxError):
            prov.create("tpl", timeout=60, network=network)
    assert [c.get("allow_internet_access", "default") for c in calls] == ["default", False, True]


class SequenceProvider:
    """Hands out the given sandboxes (or raises the given exceptions) in order; records each create."""

    name = "fake"

    def __init__(self, *items):
        self.items = list(items)
        self.created: list[dict] = []

    def create(self, template, *, timeout, env=None, metadata=None, **kw):
        self.created.append({"template": template, "metadata": metadata, **kw})
        item = self.items.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


def _dying():  # the sandbox is gone when the eval ends (the patch's code killed it, or the host did)
    return FakeSandbox(log="", exit_code=137, rules=[("sweflow-alive", SandboxError("gone"))])


def _control():
    return FakeSandbox(rules=[("sweflow-control", CommandResult(0, "sweflow-control\n", ""))])


def _no_sleep(_s):
    return None


def test_an_agent_patch_that_kills_every_sandbox_while_the_provider_is_healthy_is_graded_zero():
    from sweflow.grading.agent_eval import evaluate_agent_patch
    from sweflow.grading.evaluate import PATCH_DEFEATED_EVALUATION

    prov = SequenceProvider(_dying(), _dying(), _control())
    res = evaluate_agent_patch(prov, "tpl", META, SRC_PATCH, attempts=2, sleep=_no_sleep)
    assert (res.failure_reason, res.infra, res.reward) == (PATCH_DEFEATED_EVALUATION, False, 0.0)
    assert [c["metadata"]["purpose"] for c in prov.created] == ["fresh_eval", "fresh_eval", "control"]
    assert "try 1: sandbox_lost" in res.output_tail and "try 2: sandbox_lost" in res.output_tail


def test_an_agent_patch_survives_one_lost_sandbox_and_is_graded_on_the_retry():
    from sweflow.grading.agent_eval import evaluate_agent_patch

    slept = []
    prov = SequenceProvider(_dying(), FakeSandbox(log=pytest_log(ALL_PASS)))
    res = evaluate_agent_patch(prov, "tpl", META, SRC_PATCH, attempts=2, backoff=3.0, sleep=slept.append)
    assert (res.resolved, res.reward, res.infra) == (True, 1.0, False) and slept == [3.0]
    assert len(prov.created) == 2


def test_when_the_control_sandbox_fails_too_it_stays_infrastructure():
    from sweflow.grading.agent_eval import evaluate_agent_patch

    for control in (
        SandboxError("provider down"),
        FakeSandbox(rules=[("sweflow-control", SandboxError("x"))]),
    ):
        prov = SequenceProvider(_dying(), _dying(), control)
        res = evaluate_agent_patch(prov, "tpl", META, SRC_PATCH, attempts=2, sleep=_no_sleep)
        assert (res.failure_reason, res.infra) == ("sandbox_lost", True)


def test_provider_faults_and_empty_patches_are_never_blamed_on_the_patch():
    from sweflow.grading.agent_eval import evaluate_agent_patch

    prov = SequenceProvider(SandboxError("create failed"), SandboxError("create failed"), _control())
    res = evaluate_agent_patch(prov, "tpl", META, SRC_PATCH, attempts=2, sleep=_no_sleep)
    assert (res.failure_reason, res.infra) == ("fresh_eval_exception", True) and len(prov.created) == 2
    prov = SequenceProvider(_dying(), _dying(), _control())
    res = evaluate_agent_patch(prov, "tpl", META, "", attempts=2, sleep=_no_sleep)
    assert (res.failure_reason, res.infra) == ("sandbox_lost", True) and len(prov.created) == 2
