"""The blackbox HTTP API, driven with a fake `claude` that prints stream-json lines (no real agent)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sweflow import __version__
from sweflow.blackbox import BlackboxServer

# The fake agent mimics the CLI contract: prompt on stdin, stream-json on stdout, a final result event.
# The prompt picks the behaviour: "sleep:N" sleeps (with a grandchild in its group), "crash" dies,
# anything else echoes. It appends its argv/env/pid to $FAKE_AGENT_LOG so tests can inspect them.
FAKE_AGENT = textwrap.dedent(
    """\
    import json, os, subprocess, sys, time
    args = sys.argv[1:]
    prompt = sys.stdin.read()
    sid = args[args.index("--resume") + 1] if "--resume" in args else args[args.index("--session-id") + 1]
    with open(os.environ["FAKE_AGENT_LOG"], "a") as fh:
        keep = {k: v for k, v in os.environ.items() if k.startswith(("ANTHROPIC", "HOME", "IS_SANDBOX", "CLAUDE", "DISABLE"))}
        fh.write(json.dumps({"argv": args, "env": keep, "pid": os.getpid(), "prompt": prompt, "cwd": os.getcwd()}) + "\\n")
    def emit(obj):
        print(json.dumps(obj), flush=True)
    emit({"type": "system", "subtype": "init", "session_id": sid, "cwd": os.getcwd()})
    if prompt == "crash":
        print("boom: fake agent crashed", file=sys.stderr, flush=True)
        sys.exit(3)
    # Like the CLI: the conversation is saved under $HOME/.claude/projects/<cwd>/<session>.jsonl.
    project = os.path.join(os.environ["HOME"], ".claude", "projects", os.getcwd().replace("/", "-"))
    os.makedirs(project, exist_ok=True)
    open(os.path.join(project, sid + ".jsonl"), "a").write(json.dumps({"prompt": prompt}) + "\\n")
    if prompt.startswith("stubborn:"):
        # Like Claude Code's Bash tool: the child lives in its own session; and this parent ignores SIGTERM.
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if prompt.startswith(("sleep:", "stubborn:")):
        child = subprocess.Popen(["sleep", prompt.split(":")[1]], start_new_session=prompt.startswith("stubborn:"))
        with open(os.environ["FAKE_AGENT_LOG"], "a") as fh:
            fh.write(json.dumps({"grandchild": child.pid}) + "\\n")
        emit({"type": "assistant", "message": {"role": "assistant", "content": [{"type": "text", "text": "sleeping"}]}})
        child.wait()
    emit({"type": "assistant", "message": {"role": "assistant", "content": [
        {"type": "text", "text": "echo " + prompt},
        {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "x.py"}}]}})
    emit({"type": "user", "message": {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "file body"}]}]}})
    print("not json at all", flush=True)
    emit({"type": "result", "subtype": "success", "is_error": False, "num_turns": 2, "result": "echo " + prompt,
          "stop_reason": "end_turn", "session_id": sid, "usage": {"input_tokens": 11, "output_tokens": 7}})
    """
)


TOKEN = "bb-test-token-0123456789"


@pytest.fixture()
def env(tmp_path: Path):
    """A server with a fake agent binary; yields (server url, log path, workdir, register body)."""
    fake = tmp_path / "fake-claude"
    fake.write_text(f"#!{sys.executable}\n{FAKE_AGENT}")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    workdir = tmp_path / "repo"
    workdir.mkdir()
    log = tmp_path / "agent.log"
    server = BlackboxServer(
        runtime_dir=str(tmp_path / "runtime"), agent_binary=str(fake), token=TOKEN
    ).start()
    body = {
        "agent_type": "claude_code",
        "router_url": "http://127.0.0.1:9/router",
        "session_id": "sess-1",
        "router_token": "proxy-session-secret",
        "instance_id": "sweflow__calclib-1",
        "backend_options": {
            "working_directory": str(workdir),
            "max_turns": 7,
            "permission_mode": "bypassPermissions",
            "allowed_tools": ["Bash", "Edit"],
            "model": "stub-model",
            "env": {"FAKE_AGENT_LOG": str(log)},
        },
    }
    try:
        yield server.url, log, workdir, body
    finally:
        server.stop()


def call(
    url: str,
    method: str = "GET",
    body: object = None,
    raw: bytes | None = None,
    timeout: float = 30,
    token: str | None = None,
):
    """One request with the server's token (or `token`); (status, decoded JSON answer)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token or TOKEN}"}
    req = urllib.request.Request(url, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def log_entries(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def wait_for_state(url: str, sid: str, state: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if call(f"{url}/v1/sessions/{sid}?events=0")[1].get("state") == state:
            return
        time.sleep(0.05)
    raise AssertionError(f"session {sid} never reached state {state}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_health_and_status(env):
    url, _, _, body = env
    assert call(f"{url}/health", token="wrong") == (
        200,
        {"healthy": True, "version": __version__, "token_configured": True},
    )
    status, st = call(f"{url}/v1/status")
    assert status == 200 and st["sessions"] == [] and st["busy"] is False and st["version"] == __version__
    call(f"{url}/v1/rollout/register", "POST", body)
    st = call(f"{url}/v1/status")[1]
    assert st["agent_type"] == "claude_code"
    assert st["sessions"] == [
        {"instance_id": "sweflow__calclib-1", "session_id": "sess-1", "state": "idle", "turns": 0}
    ]


def test_register_is_idempotent_and_conflicts_are_409(env):
    url, _, _, body = env
    first = call(f"{url}/v1/rollout/register", "POST", body)
    assert first[0] == 200 and first[1]["registered"] is True and "ignored_options" not in first[1]
    assert call(f"{url}/v1/rollout/register", "POST", body) == first
    changed = json.loads(json.dumps(body))
    changed["backend_options"]["max_turns"] = 8
    status, err = call(f"{url}/v1/rollout/register", "POST", changed)
    assert status == 409 and err["error"]["type"] == "conflict"
    other = dict(body, session_id="sess-2")
    status, err = call(f"{url}/v1/rollout/register", "POST", other)
    assert status == 409 and "sess-1" in err["error"]["message"]
    # Closing frees the slot for the next session.
    assert call(f"{url}/v1/sessions/sess-1/close", "POST", {})[0] == 200
    assert call(f"{url}/v1/rollout/register", "POST", other)[0] == 200
    assert call(f"{url}/v1/sessions/sess-1")[0] == 404


@pytest.mark.parametrize("bad", ["", "-lead", "has space", "a/b", "x" * 129, 42, None])
def test_register_rejects_bad_session_ids(env, bad):
    url, _, _, body = env
    status, err = call(f"{url}/v1/rollout/register", "POST", dict(body, session_id=bad))
    assert (
        status == 400
        and err["error"]["type"] == "invalid_request"
        and "session_id" in err["error"]["message"]
    )


def test_register_accepts_the_longest_valid_id(env):
    url, _, _, body = env
    sid = "A" + "b.:_-" * 25 + "zz"
    assert len(sid) == 128
    assert call(f"{url}/v1/rollout/register", "POST", dict(body, session_id=sid))[0] == 200


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"agent_type": "codex"}, "agent_type"),
        ({"instance_id": "bad id"}, "instance_id"),
        ({"router_url": "ftp://x"}, "router_url"),
        ({"backend_options": {"working_directory": "/no/such/dir"}}, "working_directory"),
        ({"backend_options": {"max_turns": 0}}, "max_turns"),
        ({"backend_options": {"permission_mode": "yolo"}}, "permission_mode"),
        ({"backend_options": {"env": {"A": 1}}}, "env"),
        ({"backend_options": []}, "backend_options"),
        ({"backend_options": {"max_turn": 5}}, "'max_turn' (did you mean 'max_turns'?)"),
    ],
)
def test_register_rejects_bad_fields(env, change, needle):
    url, _, _, body = env
    status, err = call(f"{url}/v1/rollout/register", "POST", {**body, **change})
    assert status == 400 and needle in err["error"]["message"]


def test_malformed_json_unknown_session_and_route(env):
    url, _, _, body = env
    status, err = call(f"{url}/v1/rollout/register", "POST", raw=b'{"agent_type": ')
    assert status == 400 and err["error"]["type"] == "invalid_json"
    status, err = call(f"{url}/v1/rollout/register", "POST", raw=b"[1, 2]")
    assert status == 400 and err["error"]["type"] == "invalid_json"
    assert call(f"{url}/v1/sessions/nope/messages", "POST", {"content": "hi"})[0] == 404
    assert call(f"{url}/v1/sessions/nope")[0] == 404
    assert call(f"{url}/v1/sessions/bad%20id")[0] == 400
    assert call(f"{url}/v1/nothing")[0] == 404
    call(f"{url}/v1/rollout/register", "POST", body)
    status, err = call(f"{url}/v1/sessions/sess-1/messages", "POST", raw=b"{not json")
    assert status == 400 and err["error"]["type"] == "invalid_json"
    for bad in ({}, {"content": ""}, {"content": [{"type": "image"}]}, {"content": "x", "timeout": -1}):
        assert call(f"{url}/v1/sessions/sess-1/messages", "POST", bad)[0] == 400


def test_messages_run_turns_and_resume(env):
    url, log, workdir, body = env
    call(f"{url}/v1/rollout/register", "POST", body)
    status, out = call(f"{url}/v1/sessions/sess-1/messages", "POST", {"content": "hello"})
    assert status == 200, out
    assert out["result"] == "echo hello" and out["is_error"] is False and out["num_turns"] == 2
    assert out["stop_reason"] == "end_turn" and out["usage"] == {"input_tokens": 11, "output_tokens": 7}
    assert out["events_count"] == 5  # init, assistant, user, raw line, result
    assert [o["type"] for o in out["outputs"]] == ["text", "tool_use", "tool_result"]
    assert out["outputs"][2] == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": "file body",
        "is_error": False,
    }
    status, out2 = call(
        f"{url}/v1/sessions/sess-1/messages",
        "POST",
        {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    )
    assert status == 200 and out2["result"] == "echo a\n\nb" and out2["turn"] == 2

    first, second = log_entries(log)
    assert first["cwd"] == str(workdir) and first["prompt"] == "hello"
    argv = first["argv"]
    assert argv[:4] == ["-p", "--output-format", "stream-json", "--verbose"]
    assert argv[argv.index("--max-turns") + 1] == "7"
    assert argv[argv.index("--permission-mode") + 1] == "bypassPermissions"
    assert argv[argv.index("--allowedTools") + 1] == "Bash,Edit"
    assert argv[argv.index("--model") + 1] == "stub-model"
    claude_sid = argv[argv.index("--session-id") + 1]
    assert "--resume" not in argv
    assert second["argv"][second["argv"].index("--resume") + 1] == claude_sid
    e = first["env"]
    assert (
        e["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/router"
        and e["ANTHROPIC_AUTH_TOKEN"] == "proxy-session-secret"
    )
    assert (
        e["IS_SANDBOX"] == "1"
        and e["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
        and e["DISABLE_AUTOUPDATER"] == "1"
    )
    assert "ANTHROPIC_API_KEY" not in e
    assert (
        e["HOME"].endswith("/sess-1/home")
        and json.loads(Path(e["HOME"], ".claude.json").read_text())["hasCompletedOnboarding"]
    )

    status, snap = call(f"{url}/v1/sessions/sess-1")
    assert status == 200 and snap["state"] == "idle" and len(snap["turns"]) == 2
    assert snap["events_total"] == 10 and len(snap["events"]) == 10
    assert {"type": "raw", "line": "not json at all"} in snap["events"]
    tail = call(f"{url}/v1/sessions/sess-1?tail=2")[1]
    assert [ev["type"] for ev in tail["events"]] == ["raw", "result"] and tail["events_start"] == 8
    assert len(call(f"{url}/v1/sessions/sess-1?since=5")[1]["events"]) == 5


def test_inherited_api_key_is_not_passed_to_the_agent(env, monkeypatch):
    url, log, _, body = env
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-should-not-leak")
    monkeypatch.setenv("HF_TOKEN", "hf-should-not-leak")
    call(f"{url}/v1/rollout/register", "POST", body)
    assert call(f"{url}/v1/sessions/sess-1/messages", "POST", {"content": "x"})[0] == 200
    assert (
        "sk-should-not-leak" not in log.read_text() and "ANTHROPIC_API_KEY" not in log_entries(log)[0]["env"]
    )


def test_agent_crash_is_500_with_stderr_tail(env):
    url, log, _, body = env
    call(f"{url}/v1/rollout/register", "POST", body)
    status, err = call(f"{url}/v1/sessions/sess-1/messages", "POST", {"content": "crash"})
    assert status == 500 and err["error"]["type"] == "agent_crash"
    assert "boom: fake agent crashed" in err["error"]["stderr_tail"] and err["error"]["returncode"] == 3
    snap = call(f"{url}/v1/sessions/sess-1")[1]
    assert snap["last_error"]["type"] == "agent_crash" and snap["turns"][0]["status"] == "crashed"
    assert snap["state"] == "idle"  # the session stays usable
    assert call(f"{url}/v1/sessions/sess-1/messages", "POST", {"content": "ok"})[0] == 200
    # The crashed turn saved no conversation, so the next one starts it instead of resuming.
    first, second = log_entries(log)
    assert "--session-id" in second["argv"] and "--resume" not in second["argv"]


def test_missing_agent_binary_is_500(env):
    url, _, _, body = env
    body = json.loads(json.dumps(body))
    body["backend_options"]["binary"] = "/no/such/claude"
    call(f"{url}/v1/rollout/register", "POST", body)
    status, err = call(f"{url}/v1/sessions/sess-1/messages", "POST", {"content": "x"})
    assert status == 500 and "/no/such/claude" in err["error"]["stderr_tail"]


def test_turn_timeout_kills_the_agent_and_answers_504(env):
    url, log, _, body = env
    call(f"{url}/v1/rollout/register", "POST", body)
    t0 = time.monotonic()
    status, err = call(f"{url}/v1/sessions/sess-1/messages", "POST", {"content": "sleep:30", "timeout": 1.5})
    assert status == 504 and err["error"]["type"] == "agent_timeout"
    assert 1.5 <= time.monotonic() - t0 < 6
    entries = log_entries(log)
    pids = [e["pid"] for e in entries if "pid" in e] + [e["grandchild"] for e in entries if "grandchild" in e]
    assert len(pids) == 2 and not any(pid_alive(p) for p in pids)


@pytest.mark.parametrize("mode", ["sleep", "stubborn"])
def test_abort_returns_the_pending_turn_promptly_and_kills_the_group(env, mode):
    url, log, _, body = env
    call(f"{url}/v1/rollout/register", "POST", body)
    answer: dict = {}
    worker = threading.Thread(
        target=lambda: answer.update(
            r=call(f"{url}/v1/sessions/sess-1/messages", "POST", {"content": f"{mode}:30"})
        )
    )
    worker.start()
    wait_for_state(url, "sess-1", "running")
    assert call(f"{url}/v1/status")[1]["busy"] is True
    deadline = time.monotonic() + 10
    while not any("grandchild" in e for e in log_entries(log)):  # the agent is now deep in its turn
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # While the turn runs, shell commands and a second turn are refused.
    status, err = call(f"{url}/v1/sessions/sess-1/execute_cmd", "POST", {"cmd": "true", "timeout": 5})
    assert status == 409 and err["error"]["type"] == "session_busy"
    assert call(f"{url}/v1/sessions/sess-1/messages", "POST", {"content": "again"})[0] == 409
    t0 = time.monotonic()
    status, ab = call(f"{url}/v1/sessions/sess-1/abort", "POST", {})
    assert status == 200 and ab["aborted"] is True
    worker.join(10)
    assert not worker.is_alive() and time.monotonic() - t0 < 5
    status, err = answer["r"]
    assert status == 409 and err["error"]["type"] == "aborted"
    entries = log_entries(log)
    pids = [e["pid"] for e in entries if "pid" in e] + [e["grandchild"] for e in entries if "grandchild" in e]
    assert len(pids) == 2 and not any(pid_alive(p) for p in pids)
    snap = call(f"{url}/v1/sessions/sess-1?events=0")[1]
    assert snap["state"] == "idle" and snap["turns"][0]["status"] == "aborted" and snap["events"] == []
    assert call(f"{url}/v1/sessions/sess-1/abort", "POST", {})[1]["aborted"] is False


def test_execute_cmd(env):
    url, _, workdir, body = env
    call(f"{url}/v1/rollout/register", "POST", body)
    status, out = call(
        f"{url}/v1/sessions/sess-1/execute_cmd", "POST", {"cmd": "pwd; echo err >&2; exit 4", "timeout": 10}
    )
    assert status == 200
    assert out["stdout"].strip() == str(workdir) and out["stderr"].strip().endswith("err")
    assert out["returncode"] == 4 and out["timed_out"] is False
    status, out = call(
        f"{url}/v1/sessions/sess-1/execute_cmd", "POST", {"cmd": "yes | head -c 300000", "timeout": 10}
    )
    assert status == 200 and 0 < len(out["stdout"]) <= 64_000
    for bad in (
        {"timeout": 3},
        {"cmd": ""},
        {"cmd": "true", "timeout": "x"},
        {"cmd": "true", "cwd": "/no/such"},
    ):
        assert call(f"{url}/v1/sessions/sess-1/execute_cmd", "POST", bad)[0] == 400


def test_execute_cmd_timeout_kills_the_command(env, tmp_path):
    url, _, _, body = env
    call(f"{url}/v1/rollout/register", "POST", body)
    marker = tmp_path / "late"
    t0 = time.monotonic()
    status, out = call(
        f"{url}/v1/sessions/sess-1/execute_cmd",
        "POST",
        {"cmd": f"echo early; sleep 3; touch {marker}", "timeout": 1.0},  # 1 s: `bash -l` is slow under load
    )
    assert status == 200 and out["timed_out"] is True and out["returncode"] == 124
    assert out["stdout"] == "early\n" and time.monotonic() - t0 < 2.8
    time.sleep(max(0.0, t0 + 3.5 - time.monotonic()))
    assert not marker.exists()


def test_blackbox_imports_only_the_standard_library():
    code = (
        "import sys, sweflow.blackbox, sweflow.blackbox.__main__;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] not in sys.stdlib_module_names"
        " and m.split('.')[0] not in ('sweflow', '__main__'));"
        "extra = sorted(m for m in sys.modules if m.startswith('sweflow') and m != 'sweflow'"
        " and not m.startswith('sweflow.blackbox'));"
        "print(bad + extra)"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_cli_serves_health_on_the_env_port(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sweflow.blackbox", "--host", "127.0.0.1", "--runtime-dir", str(tmp_path)],
        env={**os.environ, "SWEFLOW_BLACKBOX_PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                assert call(f"http://127.0.0.1:{port}/health", timeout=2)[1]["healthy"] is True
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        proc.terminate()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
