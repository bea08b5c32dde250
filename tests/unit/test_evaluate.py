"""Patch extraction and fresh evaluation against scripted fake sandboxes (no daemons)."""

from __future__ import annotations

import json

import pytest

from sweflow.errors import EvalError, SandboxError
from sweflow.evaluate import (
    OUTPUT_TAIL_CHARS,
    EvalResult,
    PatchResult,
    check_patch,
    evaluate_patch,
    extract_patch,
    patch_paths,
)
from sweflow.harness.driver import DEFAULT_REWARD_MARKER
from sweflow.sandbox.base import CommandResult

BASE = "a" * 40
SRC_PATCH = (
    "diff --git a/calclib/ops.py b/calclib/ops.py\n--- a/calclib/ops.py\n+++ b/calclib/ops.py\n"
    "@@ -1 +1 @@\n-x = 1\n+x = 2\n"
)
TEST_PATCH = (
    "diff --git a/tests/test_ops.py b/tests/test_ops.py\n--- a/tests/test_ops.py\n+++ b/tests/test_ops.py\n"
    "@@ -1 +1 @@\n-assert 0\n+assert 1\n"
)


def marker(resolved: bool, reason: str | None = None) -> str:
    payload = {"resolved": resolved, "failure_reason": reason, "fail_to_pass_success": int(resolved)}
    return DEFAULT_REWARD_MARKER + json.dumps(payload) + "\n"


class FakeBackground:
    def __init__(self, sb: FakeSandbox, polls_until_done: int, result: CommandResult, poll_errors: int = 0):
        self.sb, self.left, self.result, self.poll_errors = sb, polls_until_done, result, poll_errors
        self.killed = False
        self.polls = 0

    def poll(self):
        self.polls += 1
        if self.poll_errors:
            self.poll_errors -= 1
            raise SandboxError("poll hiccup")
        if self.killed:
            return CommandResult(137, "", "", False)
        self.left -= 1
        return self.result if self.left <= 0 else None

    def kill(self):
        self.killed = True


class FakeSandbox:
    """Answers commands from a list of (substring, CommandResult | Exception) rules; records everything."""

    def __init__(self, rules=(), files=None, bg=None):
        self.id, self.template = "fake-1", "tpl"
        self.rules = list(rules)
        self.files = dict(files or {})
        self.cmds: list[str] = []
        self.written: dict[str, bytes] = {}
        self.started: list[tuple[str, str | None]] = []
        self.bg_spec = bg or {}
        self.bg: FakeBackground | None = None
        self.kill_count = 0

    def run(self, cmd, *, timeout, env=None, cwd=None):
        self.cmds.append(cmd)
        for needle, answer in self.rules:
            if needle in cmd:
                if isinstance(answer, list):  # a sequence of answers, consumed in order
                    a = answer.pop(0) if len(answer) > 1 else answer[0]
                else:
                    a = answer
                if isinstance(a, Exception):
                    raise a
                return a
        return CommandResult(0, "", "")

    def start(self, cmd, *, env=None, cwd=None):
        self.started.append((cmd, cwd))
        self.bg = FakeBackground(self, **self.bg_spec)
        return self.bg

    def write_file(self, path, data, *, timeout=60):
        self.written[path] = data if isinstance(data, bytes) else data.encode()

    def read_file(self, path, *, timeout=60):
        data = self.files.get(path)
        if isinstance(data, list):
            data = data.pop(0) if len(data) > 1 else data[0]
        if isinstance(data, Exception):
            raise data
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

    def create(self, template, *, timeout, env=None, metadata=None):
        self.created.append({"template": template, "timeout": timeout, "env": env, "metadata": metadata})
        if isinstance(self.sb, Exception):
            raise self.sb
        return self.sb


META = {
    "instance_id": "org__repo-1",
    "base_commit": BASE,
    "workdir": "/testbed",
    "reward_marker": DEFAULT_REWARD_MARKER,
    "blackbox_execute_cmds": {
        "before_agent": [{"name": "git_sanitizer", "cmd": "sanitize", "required": True, "timeout": 120}],
        "after_agent": [{"name": "harness_eval", "cmd": "EVALUATOR-CMD", "required": True, "timeout": 1260}],
    },
}


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
    assert "cd '/work dir' && git add -A && " in cmd and f"diff --cached --binary {BASE} >" in cmd


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
        rules=[("git add -A", [SandboxError("exec create timed out"), CommandResult(0, "", "")])],
        files={"/tmp/.sweflow/patch.diff": [SandboxError("read hiccup"), SRC_PATCH.encode()]},
    )
    got = extract_patch(sb, BASE, attempts=3)
    assert got.failure_reason is None and got.patch == SRC_PATCH and len(sb.cmds) == 3


def test_extract_patch_gives_up_with_a_reason(monkeypatch):
    monkeypatch.setattr("sweflow.util.time.sleep", lambda s: None)
    sb = FakeSandbox(rules=[("git add -A", SandboxError("sandbox is gone"))])
    got = extract_patch(sb, BASE, attempts=2)
    assert got.failure_reason == "patch_extraction_failed" and "sandbox is gone" in got.error
    assert len(sb.cmds) == 2
    sb = FakeSandbox(rules=[("git add -A", CommandResult(128, "", "fatal: bad revision"))])
    got = extract_patch(sb, BASE, attempts=2)
    assert got.failure_reason == "patch_extraction_failed" and "bad revision" in got.error
    assert len(sb.cmds) == 1, "a git error is not retried"


def test_non_utf8_patch_bytes_survive_the_round_trip():
    raw = SRC_PATCH.encode() + b"+caf\xe9\n"
    sb = FakeSandbox(files={"/tmp/.sweflow/patch.diff": raw})
    got = extract_patch(sb, BASE)
    sb2 = FakeSandbox(bg={"polls_until_done": 1, "result": CommandResult(0, marker(True), "")})
    evaluate_patch(FakeProvider(sb2), "tpl", META, got.patch, poll_interval=0.01)
    assert sb2.written["/tmp/.sweflow/patch.diff"] == raw


# ----- evaluate_patch --------------------------------------------------------------------------------------
def test_resolved_run_resets_applies_polls_and_kills(monkeypatch):
    sleeps = []
    monkeypatch.setattr("sweflow.evaluate.time.sleep", sleeps.append)
    sb = FakeSandbox(bg={"polls_until_done": 5, "result": CommandResult(0, "noise\n" + marker(True), "")})
    prov = FakeProvider(sb)
    res = evaluate_patch(prov, "tpl-x", META, SRC_PATCH, poll_interval=4.0, env={"A": "1"})
    assert (res.reward, res.resolved, res.failure_reason, res.error) == (1.0, True, None, None)
    assert res.marker["resolved"] is True and "noise" in res.output_tail
    assert prov.created[0]["template"] == "tpl-x" and prov.created[0]["env"] == {"A": "1"}
    assert prov.created[0]["metadata"]["instance_id"] == "org__repo-1"
    assert f"git reset -q --hard {BASE}" in sb.cmds[0] and "git clean -fdq" in sb.cmds[0]
    assert "git apply --binary" in sb.cmds[1]
    assert sb.written["/tmp/.sweflow/patch.diff"] == SRC_PATCH.encode()
    assert sb.started == [("EVALUATOR-CMD", "/testbed")]
    assert sleeps == [1.0, 2.0, 4.0, 4.0, 4.0], "polls back off to poll_interval; no long-held request"
    assert sb.kill_count == 1
    assert {"create_s", "setup_s", "eval_s", "kill_s", "total_s"} <= set(res.timings)
    assert EvalResult(**res.to_dict()) == res


def test_empty_patch_skips_apply_and_grades_the_base(monkeypatch):
    monkeypatch.setattr("sweflow.evaluate.time.sleep", lambda s: None)
    sb = FakeSandbox(
        bg={"polls_until_done": 1, "result": CommandResult(0, marker(False, "fail_to_pass_failure"), "")}
    )
    res = evaluate_patch(FakeProvider(sb), "tpl", META, "")
    assert (res.reward, res.resolved, res.failure_reason) == (0.0, False, "fail_to_pass_failure")
    assert not any("git apply" in c for c in sb.cmds) and not sb.written


def test_failed_apply(monkeypatch):
    sb = FakeSandbox(rules=[("git apply", CommandResult(1, "", "error: patch failed: calclib/ops.py:1"))])
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert (res.reward, res.failure_reason) == (0.0, "failed_apply_patch")
    assert "patch failed: calclib/ops.py:1" in res.output_tail
    assert sb.started == [] and sb.kill_count == 1


@pytest.mark.parametrize(
    ("stdout", "reason"),
    [
        ("pytest output but no marker\n", "missing_reward_marker"),
        (DEFAULT_REWARD_MARKER + "{not json\n", "malformed_reward_marker"),
        ("  " + DEFAULT_REWARD_MARKER + '{"resolved": "yes"}\n', "malformed_reward_marker"),
        ("log says " + DEFAULT_REWARD_MARKER + '{"resolved": true}\n', "missing_reward_marker"),
    ],
)
def test_missing_or_malformed_marker(monkeypatch, stdout, reason):
    monkeypatch.setattr("sweflow.evaluate.time.sleep", lambda s: None)
    sb = FakeSandbox(bg={"polls_until_done": 1, "result": CommandResult(1, stdout, "")})
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert (res.reward, res.resolved, res.failure_reason) == (0.0, False, reason)


def test_resolved_requires_no_failure_reason(monkeypatch):
    monkeypatch.setattr("sweflow.evaluate.time.sleep", lambda s: None)
    out = DEFAULT_REWARD_MARKER + json.dumps({"resolved": True, "failure_reason": "eval_timeout"}) + "\n"
    sb = FakeSandbox(bg={"polls_until_done": 1, "result": CommandResult(0, out, "")})
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert (res.reward, res.resolved, res.failure_reason) == (0.0, False, "eval_timeout")


def test_provider_errors_become_fresh_eval_exception(monkeypatch):
    res = evaluate_patch(
        FakeProvider(SandboxError("template image not found", file="tpl")), "tpl", META, SRC_PATCH
    )
    assert (res.reward, res.failure_reason) == (0.0, "fresh_eval_exception")
    assert res.error == "SandboxError: tpl: template image not found"
    sb = FakeSandbox(rules=[("git reset", SandboxError("exec create timed out after 60s"))])
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert res.failure_reason == "fresh_eval_exception" and "exec create timed out" in res.error
    assert sb.kill_count == 1
    sb = FakeSandbox(rules=[("git reset", CommandResult(128, "", "fatal: unknown revision"))])
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert res.failure_reason == "fresh_eval_exception" and "unknown revision" in res.error


def test_transient_poll_errors_are_tolerated_but_not_forever(monkeypatch):
    monkeypatch.setattr("sweflow.evaluate.time.sleep", lambda s: None)
    sb = FakeSandbox(
        bg={"polls_until_done": 1, "result": CommandResult(0, marker(True), ""), "poll_errors": 2}
    )
    assert evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH).resolved
    sb = FakeSandbox(
        bg={"polls_until_done": 1, "result": CommandResult(0, marker(True), ""), "poll_errors": 3}
    )
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert res.failure_reason == "fresh_eval_exception" and "poll hiccup" in res.error and sb.kill_count == 1


def test_deadline_kills_the_command_and_the_sandbox():
    import time

    sb = FakeSandbox(bg={"polls_until_done": 10**9, "result": CommandResult(0, marker(True), "")})
    t0 = time.monotonic()
    res = evaluate_patch(
        FakeProvider(sb), "tpl", META, SRC_PATCH, poll_interval=0.05, deadline=time.monotonic() + 0.3
    )
    assert time.monotonic() - t0 < 2
    assert (res.reward, res.failure_reason) == (0.0, "fresh_eval_timeout")
    assert sb.bg.killed and sb.kill_count == 1


def test_output_tail_is_bounded(monkeypatch):
    monkeypatch.setattr("sweflow.evaluate.time.sleep", lambda s: None)
    out = "x" * 100_000 + "\n" + marker(True)
    sb = FakeSandbox(bg={"polls_until_done": 1, "result": CommandResult(0, out, "e" * 50_000)})
    res = evaluate_patch(FakeProvider(sb), "tpl", META, SRC_PATCH)
    assert res.resolved and len(res.output_tail) == OUTPUT_TAIL_CHARS


def test_row_without_evaluator_is_a_caller_error():
    meta = {**META, "blackbox_execute_cmds": {"before_agent": [], "after_agent": []}}
    prov = FakeProvider(FakeSandbox())
    with pytest.raises(EvalError, match="no after-agent evaluator"):
        evaluate_patch(prov, "tpl", meta, SRC_PATCH)
    assert prov.created == []
