"""A real Claude Code CLI driven through the blackbox server against the scripted Anthropic stub."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sweflow.blackbox import BlackboxServer
from tests.fakes.anthropic_stub import AnthropicStub, text, tool_use, turn

CLAUDE = os.environ.get("SWEFLOW_CLAUDE_BIN") or shutil.which("claude")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.claude,
    pytest.mark.skipif(
        CLAUDE is None, reason="Claude Code CLI not found (npm i -g @anthropic-ai/claude-code)"
    ),
]

BUGGY = "def add(a, b):\n    return a - b\n"
TOKEN = "blackbox-test-token-0123456789"  # the sandbox's blackbox secret
ROUTER_TOKEN = "proxy-session-token-abcdef"  # the agent's credential at the router


def call(url: str, method: str = "GET", body: object = None, timeout: float = 120):
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    req = urllib.request.Request(url, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "testbed"
    path.mkdir()
    (path / "calc.py").write_text(BUGGY)
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], cwd=path, check=True, timeout=30)
    subprocess.run(git + ["add", "."], cwd=path, check=True, timeout=30)
    subprocess.run(git + ["commit", "-qm", "base"], cwd=path, check=True, timeout=30)
    return path


def register(url: str, router_url: str, repo: Path, sid: str, mode: str, **extra: object) -> None:
    body = {
        "agent_type": "claude_code",
        "router_url": router_url,
        "session_id": sid,
        "router_token": ROUTER_TOKEN,
        "instance_id": "sweflow__calclib-1",
        "backend_options": {"working_directory": str(repo), "max_turns": 6, "permission_mode": mode, **extra},
    }
    status, answer = call(f"{url}/v1/rollout/register", "POST", body)
    assert status == 200, answer


def test_claude_reads_and_edits_a_file_through_the_blackbox(repo, tmp_path):
    target = str(repo / "calc.py")
    policy = [
        turn(text("Let me look."), tool_use("Read", {"file_path": target})),
        turn(tool_use("Edit", {"file_path": target, "old_string": "a - b", "new_string": "a + b"})),
        turn(text("done")),
        turn(text("still done")),
    ]
    sid = "sweflow__calclib-1.rollout:0"
    with (
        AnthropicStub(policy) as stub,
        BlackboxServer(runtime_dir=str(tmp_path / "bbs"), agent_binary=CLAUDE, token=TOKEN) as bb,
    ):
        register(bb.url, stub.url, repo, sid, "acceptEdits")
        status, out = call(
            f"{bb.url}/v1/sessions/{sid}/messages", "POST", {"content": "Fix add() in calc.py."}
        )
        assert status == 200, out
        assert out["result"] == "done" and out["is_error"] is False and out["num_turns"] == 3
        kinds = [(o["type"], o.get("name")) for o in out["outputs"]]
        assert kinds == [
            ("text", None),
            ("tool_use", "Read"),
            ("tool_result", None),
            ("tool_use", "Edit"),
            ("tool_result", None),
            ("text", None),
        ]
        assert (repo / "calc.py").read_text() == BUGGY.replace("a - b", "a + b")

        # The agent's traffic: every scripted request carried the router token as bearer, and the
        # tool results of the Read and the Edit came back to the model.
        served = stub.agent_requests
        assert len(served) == 3 and {r.bearer for r in served} == {ROUTER_TOKEN}
        assert not any(r.has_api_key for r in stub.requests)
        assert all(r.path.startswith("/v1/messages") for r in stub.requests)
        assert {"Read", "Edit", "Bash"} <= set(served[0].tool_names())
        read_result = served[1].tool_results()[-1]
        assert "return a - b" in json.dumps(read_result["content"]) and not read_result.get("is_error")
        edit_result = served[2].tool_results()[-1]
        assert "updated" in json.dumps(edit_result["content"]) and not edit_result.get("is_error")
        assert stub.errors == []

        # A second message resumes the same Claude conversation.
        status, out2 = call(f"{bb.url}/v1/sessions/{sid}/messages", "POST", {"content": "Anything else?"})
        assert (
            status == 200
            and out2["result"] == "still done"
            and out2["claude_session_id"] == out["claude_session_id"]
        )
        history = json.dumps(stub.agent_requests[-1].body["messages"])
        assert "Fix add() in calc.py." in history and "Anything else?" in history

        status, diff = call(
            f"{bb.url}/v1/sessions/{sid}/execute_cmd", "POST", {"cmd": "git diff", "timeout": 30}
        )
        assert status == 200 and "+    return a + b" in diff["stdout"]
        snap = call(f"{bb.url}/v1/sessions/{sid}")[1]
        assert [t["status"] for t in snap["turns"]] == ["ok", "ok"]
        assert snap["events"][0]["type"] == "system" and snap["events"][-1]["type"] == "result"


def test_abort_kills_a_running_bash_tool(repo, tmp_path):
    pidfile = tmp_path / "bash.pid"
    command = f"echo $$ > {pidfile}; sleep 60; echo late > {tmp_path / 'late'}"
    policy = [turn(tool_use("Bash", {"command": command, "description": "Wait a while"})), turn(text("done"))]
    sid = "abort-1"
    with (
        AnthropicStub(policy) as stub,
        BlackboxServer(runtime_dir=str(tmp_path / "bbs"), agent_binary=CLAUDE, token=TOKEN) as bb,
    ):
        register(bb.url, stub.url, repo, sid, "bypassPermissions")
        answer: dict = {}
        worker = threading.Thread(
            target=lambda: answer.update(
                r=call(f"{bb.url}/v1/sessions/{sid}/messages", "POST", {"content": "wait"})
            )
        )
        worker.start()
        deadline = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert time.monotonic() < deadline, "the Bash tool never started"
            time.sleep(0.05)
        shell_pid = int(pidfile.read_text())
        t0 = time.monotonic()
        assert call(f"{bb.url}/v1/sessions/{sid}/abort", "POST", {})[1]["aborted"] is True
        worker.join(15)
        assert not worker.is_alive() and time.monotonic() - t0 < 6
        status, err = answer["r"]
        assert status == 409 and err["error"]["type"] == "aborted"
        time.sleep(0.3)
        alive = (
            Path(f"/proc/{shell_pid}").exists()
            and Path(f"/proc/{shell_pid}/stat").read_text().split()[2] != "Z"
        )
        assert not alive, "the agent's Bash tool survived the abort"


def test_unreachable_router_is_a_result_with_is_error(repo, tmp_path):
    with socket.socket() as sock:  # a loopback port nobody listens on once this socket is closed
        sock.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with BlackboxServer(runtime_dir=str(tmp_path / "bbs"), agent_binary=CLAUDE, token=TOKEN) as bb:
        # The CLI gets ECONNREFUSED and, with no retries, reports an API error as its result.
        register(bb.url, dead_url, repo, "down-1", "acceptEdits", max_retries=0)
        status, out = call(f"{bb.url}/v1/sessions/down-1/messages", "POST", {"content": "hi"}, timeout=60)
    assert status == 200 and out["is_error"] is True and out["api_error"] == "connection_failed"
    assert (repo / "calc.py").read_text() == BUGGY


# A Bash tool call that records the argv and environment of the Claude Code process running it (the
# first ancestor of its shell whose command line names the conversation) into OUT.argv / OUT.env.
FIND_CLI = (
    'p=$$; while [ "$p" -gt 1 ]; do '
    "if tr '\\0' '\\n' < /proc/$p/cmdline | grep -qx -e --session-id -e --resume; then "
    "cp /proc/$p/cmdline OUT.argv; cp /proc/$p/environ OUT.env; break; fi; "
    "p=$(awk '{print $4}' /proc/$p/stat); done"
)
APPENDED = "SWEFLOW-APPENDED-INSTRUCTIONS: work only inside the repository."
REPLACING = "SWEFLOW-REPLACING-PROMPT: you fix bugs."


def _system_text(request) -> str:
    system = request.body.get("system")
    if isinstance(system, str):
        return system
    return "\n".join(b.get("text", "") for b in system or [])


def test_recipe_options_reach_the_real_cli_and_its_requests(repo, tmp_path):
    """Each Claude Code option of the recipe reaches the CLI and has its effect on the model requests.

    The repository carries project settings that deny the Write tool: with setting_sources [user] they are
    not loaded, with [user, project] they are.
    """
    (repo / ".claude").mkdir()
    (repo / ".claude" / "settings.json").write_text(json.dumps({"permissions": {"deny": ["Write"]}}))
    out = tmp_path / "cli"
    recipe = {
        "setting_sources": ["user"],
        "system_prompt": APPENDED,
        "system_prompt_mode": "append",
        "auto_compact": False,
        "prompt_caching": False,
        "disable_nonessential_traffic": True,
        "subagents": False,
    }
    policy = [
        turn(tool_use("Bash", {"command": FIND_CLI.replace("OUT", str(out)), "description": "Inspect"})),
        turn(text("done")),
    ]
    with (
        AnthropicStub(policy) as stub,
        BlackboxServer(runtime_dir=str(tmp_path / "bbs"), agent_binary=CLAUDE, token=TOKEN) as bb,
    ):
        register(bb.url, stub.url, repo, "recipe-1", "bypassPermissions", **recipe)
        status, answer = call(f"{bb.url}/v1/sessions/recipe-1/messages", "POST", {"content": "Look around."})
        assert status == 200 and answer["result"] == "done", answer
        init = call(f"{bb.url}/v1/sessions/recipe-1")[1]["events"][0]
        assert call(f"{bb.url}/v1/sessions/recipe-1/close", "POST", {})[0] == 200
        requests = stub.agent_requests
        assert len(requests) == 2 and stub.errors == []

    # The process's own argv and environment, and the settings files of its HOME.
    argv = Path(f"{out}.argv").read_bytes().decode().split("\0")
    env = dict(v.split("=", 1) for v in Path(f"{out}.env").read_bytes().decode().split("\0") if "=" in v)
    assert argv[argv.index("--setting-sources") + 1] == "user"
    assert argv[argv.index("--append-system-prompt") + 1] == APPENDED and "--system-prompt" not in argv
    assert {"Agent", "Task", "Workflow"} <= set(argv[argv.index("--disallowedTools") + 1].split(","))
    for name in (
        "DISABLE_PROMPT_CACHING",
        "DISABLE_AUTO_COMPACT",
        "DISABLE_COMPACT",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
    ):
        assert env.get(name) == "1", name
    home = Path(env["HOME"])
    assert json.loads((home / ".claude" / "settings.json").read_text())["autoCompactEnabled"] is False
    assert json.loads((home / ".claude.json").read_text())["autoCompactEnabled"] is False

    # Their effects: no sub-agent tool, no cache_control, the appended text after Claude Code's own
    # system prompt, project settings not loaded (Write offered), no /compact, analytics off.
    for request in requests:
        assert not {"Agent", "Task", "Workflow"} & set(request.tool_names())
        assert "Write" in request.tool_names()
        assert "cache_control" not in json.dumps(request.body)
    system = _system_text(requests[0])
    own = system[: system.index(APPENDED)]
    assert system.rstrip().endswith(APPENDED) and len(own) > 2000  # Claude Code's own prompt comes first
    assert init["subtype"] == "init" and "compact" not in init["slash_commands"]
    assert init["analytics_disabled"] is True and "Agent" not in init["tools"]

    # The other values, in one more short turn: every effect above turns around.
    opposite = {
        "setting_sources": ["user", "project"],
        "system_prompt": REPLACING,
        "system_prompt_mode": "replace",
        "auto_compact": True,
        "prompt_caching": True,
        "disable_nonessential_traffic": False,
        "subagents": True,
    }
    with (
        AnthropicStub([turn(text("done"))]) as stub,
        BlackboxServer(runtime_dir=str(tmp_path / "bbs2"), agent_binary=CLAUDE, token=TOKEN) as bb,
    ):
        register(bb.url, stub.url, repo, "opposite-1", "acceptEdits", **opposite)
        status, answer = call(f"{bb.url}/v1/sessions/opposite-1/messages", "POST", {"content": "hi"})
        assert status == 200 and answer["result"] == "done", answer
        init = call(f"{bb.url}/v1/sessions/opposite-1")[1]["events"][0]
        request = stub.agent_requests[0]
    assert "Agent" in request.tool_names() and "Write" not in request.tool_names()
    assert "cache_control" in json.dumps(request.body)
    replaced = _system_text(request)
    assert REPLACING in replaced and APPENDED not in replaced
    assert max(own.splitlines(), key=len) not in replaced  # Claude Code's own prompt is gone
    assert "compact" in init["slash_commands"] and init["analytics_disabled"] is False


COMPACTION_PROMPT = "Respond with TEXT ONLY"  # the start of the CLI's summary request (2.1.332)


@pytest.mark.parametrize(
    ("at", "reported", "compacts"), [(57_536, 57_300, False), (57_536, 57_800, True), (None, 57_800, False)]
)
def test_compact_at_tokens_is_where_the_real_cli_compacts(repo, tmp_path, at, reported, compacts):
    """The recipe compacts at context - response / 2 = 57,536 tokens: a reply whose usage reports a little
    less leaves the conversation alone, a little more makes the CLI ask for a summary and go on from it
    (a rewritten history: a new token-in/token-out lineage at the proxy). The CLI's own threshold is
    higher (no window alone takes it below 67,000)."""
    policy = [  # the CLI checks its context before it sends a tool result back
        turn(tool_use("Bash", {"command": "echo one", "description": "Echo"})),
        turn(tool_use("Bash", {"command": "echo two", "description": "Echo"})),
        turn(text("Summary: echoed one and two.")),
        turn(text("done")),
        turn(text("done again")),
    ]
    with (
        AnthropicStub(policy, input_tokens=reported) as stub,
        BlackboxServer(runtime_dir=str(tmp_path / "bbs"), agent_binary=CLAUDE, token=TOKEN) as bb,
    ):
        register(bb.url, stub.url, repo, "compact-1", "bypassPermissions", auto_compact=True,
                 compact_at_tokens=at)  # fmt: skip
        status, answer = call(f"{bb.url}/v1/sessions/compact-1/messages", "POST", {"content": "Look around."})
        assert status == 200 and not answer["is_error"], answer
        requests = stub.requests
    summaries = [r for r in requests if COMPACTION_PROMPT in json.dumps(r.body.get("messages", [])[-1:])]
    assert bool(summaries) == compacts, [json.dumps(r.body.get("messages", [])[-1:])[:200] for r in requests]
    if compacts:  # the request after the summary no longer carries the conversation it summarised
        after = requests[requests.index(summaries[0]) + 1]
        assert "echo one" not in json.dumps(after.body.get("messages", [])[1:2])
