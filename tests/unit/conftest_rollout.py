"""Helpers for the rollout dispatcher tests (imported explicitly).

Real pieces: the token-recording proxy (ScriptedEngine + tiny tokenizer), the blackbox server, the HTTP
clients, the integrity scan. In-process fakes, because a container per unit test is impractical:
- `FakeProvider`: a sandbox is a temp git checkout plus a real BlackboxServer on a loopback port that
  demands the sandbox's own random `blackbox_token` (as the real providers' servers do); `egress` given to
  `create` is recorded and shows up as `egress_url` (http://<egress>, the same loopback address); commands
  run with bash in that checkout; `kill()` stops the server and marks the sandbox dead.
- `FAKE_AGENT`: a stand-in for the `claude` binary with the same contract (prompt on stdin, stream-json on
  stdout, ANTHROPIC_BASE_URL + ANTHROPIC_AUTH_TOKEN, the proxy session's token); it calls the proxy's /v1/messages, runs Read/Edit/Bash
  tool calls in its cwd and reports an HTTP failure like the CLI does (a result with api_error).
- `FakeEvaluator`: git diff in the sandbox; "evaluation" in a fresh fake sandbox by a rule on the patch.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sweflow.blackbox import BlackboxServer
from sweflow.errors import SandboxError
from sweflow.sandbox.base import CommandResult, SandboxBase

FAKE_AGENT = textwrap.dedent(
    """\
    import json, os, subprocess, sys, urllib.error, urllib.request
    prompt = sys.stdin.read()
    base, token = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_AUTH_TOKEN"]
    tools = [
        {"name": "Read", "description": "read", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}},
        {"name": "Edit", "description": "edit", "input_schema": {"type": "object", "properties": {
            "file_path": {"type": "string"}, "old_string": {"type": "string"}, "new_string": {"type": "string"}}}},
        {"name": "Bash", "description": "bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}},
    ]
    def emit(obj):
        print(json.dumps(obj), flush=True)
    def run_tool(name, inp):
        path = inp.get("file_path", "")
        if name == "Read":
            return open(path).read()
        if name == "Edit":
            text = open(path).read()
            open(path, "w").write(text.replace(inp["old_string"], inp["new_string"], 1))
            return "The file " + path + " has been updated."
        if name == "Bash":
            r = subprocess.run(["bash", "-c", inp["command"]], capture_output=True, text=True)
            return r.stdout + r.stderr
        return "unknown tool"
    emit({"type": "system", "subtype": "init", "session_id": "fake"})
    messages = [{"role": "user", "content": prompt}]
    turns = 0
    while True:
        body = {"model": "policy", "max_tokens": 512, "stream": False, "system": "You fix bugs.",
                "tools": tools, "messages": messages}
        req = urllib.request.Request(base + "/v1/messages?beta=true", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": "Bearer " + token})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                answer = json.loads(resp.read())
        except (urllib.error.URLError, OSError) as exc:
            emit({"type": "result", "subtype": "error_during_execution", "is_error": True, "num_turns": turns,
                  "result": "API Error: " + str(exc), "api_error": "server_error", "errors": [str(exc)]})
            sys.exit(0)
        turns += 1
        emit({"type": "assistant", "message": {"role": "assistant", "content": answer["content"]}})
        messages.append({"role": "assistant", "content": answer["content"]})
        uses = [b for b in answer["content"] if b["type"] == "tool_use"]
        if not uses:
            break
        results = [{"type": "tool_result", "tool_use_id": b["id"], "content": run_tool(b["name"], b["input"])}
                   for b in uses]
        emit({"type": "user", "message": {"role": "user", "content": results}})
        messages.append({"role": "user", "content": results})
    text = "".join(b.get("text", "") for b in answer["content"])
    emit({"type": "result", "subtype": "success", "is_error": False, "num_turns": turns, "result": text,
          "stop_reason": "end_turn"})
    """
)

BUGGY = "def add(a, b):\n    return a - b\n"
TEST_FILE = "def test_add():\n    from calc import add\n    assert add(1, 2) == 3\n"


def make_repo(path: Path) -> str:
    """A tiny git repo (calc.py with a bug, tests/test_calc.py); returns the base commit."""
    path.mkdir(parents=True)
    (path / "calc.py").write_text(BUGGY)
    (path / "tests").mkdir()
    (path / "tests" / "test_calc.py").write_text(TEST_FILE)
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "base"]):
        subprocess.run(git + args, cwd=path, check=True, timeout=30)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=path, check=True, capture_output=True, text=True, timeout=30
    ).stdout.strip()


def write_agent(dest: Path) -> Path:
    dest.write_text(f"#!{sys.executable}\n{FAKE_AGENT}")
    dest.chmod(0o755)
    return dest


class FakeSandbox(SandboxBase):
    """A checkout copy + a real blackbox server; `run` is bash in the checkout."""

    def __init__(self, provider: FakeProvider, template: str, egress: str | None = None) -> None:
        super().__init__(f"fake-{uuid.uuid4().hex[:8]}", template)
        self.provider = provider
        self.blackbox_token = secrets.token_urlsafe(24)
        self.egress_url = f"http://{egress}" if egress else None
        self.dir = Path(tempfile.mkdtemp(prefix="sweflow-fake-sb-", dir=provider.root))
        self.workdir = self.dir / "testbed"
        shutil.copytree(provider.repo, self.workdir, symlinks=True)
        self.server = BlackboxServer(
            runtime_dir=str(self.dir / "bbs"),
            agent_binary=str(provider.agent),
            default_workdir=str(self.workdir),
            token=self.blackbox_token,
        ).start()

    def run(self, cmd: str, *, timeout: float, env=None, cwd=None) -> CommandResult:
        self._check_alive()
        try:
            p = subprocess.run(
                ["bash", "-c", cmd], cwd=cwd or self.workdir, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return CommandResult(124, "", "", True, timeout)
        return CommandResult(p.returncode, p.stdout, p.stderr)

    def start(self, cmd: str, *, env=None, cwd=None):  # pragma: no cover - not used by these tests
        raise NotImplementedError

    def write_file(self, path: str, data, *, timeout: float = 60) -> None:  # pragma: no cover
        raise NotImplementedError

    def read_file(self, path: str, *, timeout: float = 60) -> bytes:
        self._check_alive()
        return Path(path).read_bytes()  # absolute paths are the host's: the fake shares its filesystem

    def port_url(self, port: int) -> str:
        self._check_alive()
        return self.server.url

    def _kill(self) -> None:
        self.server.stop()
        self.provider.on_kill(self)
        shutil.rmtree(self.dir, ignore_errors=True)


class FakeProvider:
    """Creates FakeSandboxes from one repo; counts live sandboxes and the most alive at once."""

    name = "fake"

    def __init__(self, root: Path, repo: Path, agent: Path, *, fail_create: bool = False) -> None:
        self.root, self.repo, self.agent = root, repo, agent
        self.fail_create = fail_create
        self.created: list[FakeSandbox] = []
        self.egresses: list[str | None] = []
        self.live = 0
        self.max_live = 0
        self._lock = threading.Lock()

    def create(self, template: str, *, timeout: float, env=None, metadata=None, egress=None) -> FakeSandbox:
        if self.fail_create:
            raise SandboxError("template image not found", file=template)
        sb = FakeSandbox(self, template, egress)
        with self._lock:
            self.created.append(sb)
            self.egresses.append(egress)
            self.live += 1
            self.max_live = max(self.max_live, self.live)
        return sb

    def on_kill(self, sb: FakeSandbox) -> None:
        with self._lock:
            self.live -= 1


class FakeEvaluator:
    """`git diff` in the agent sandbox; evaluation in a fresh sandbox: resolved iff the patch has `fix`."""

    def __init__(self, fix: str = "+    return a + b", *, raise_in_eval: bool = False) -> None:
        self.fix, self.raise_in_eval = fix, raise_in_eval
        self.evaluated: list[str] = []

    def extract_patch(self, sb: FakeSandbox, base_commit: str) -> Any:
        from sweflow.grading.evaluate import check_patch

        r = sb.run(f"git add -A && git diff --cached --binary {base_commit}", timeout=60)
        if r.exit_code != 0:
            return SimpleNamespace(
                patch="", failure_reason="patch_extraction_failed", test_files=[], error=r.stderr
            )
        reason, tests = check_patch(r.stdout)
        return SimpleNamespace(patch=r.stdout, failure_reason=reason, test_files=tests, error=None)

    def evaluate_patch(self, provider: Any, template: str, metadata: dict, patch: str) -> Any:
        fresh = provider.create(template, timeout=60)
        self.evaluated.append(fresh.id)
        if self.raise_in_eval:
            raise RuntimeError("evaluator crashed")
        ok = self.fix in patch
        fresh.kill()
        marker = {"resolved": ok, "failure_reason": None if ok else "fail_to_pass_failure"}
        return SimpleNamespace(
            reward=1.0 if ok else 0.0,
            resolved=ok,
            failure_reason=marker["failure_reason"],
            marker=marker,
            timings={},
            error=None,
        )


def training_row(base_commit: str, *, sanitizer: str = "git status --short", required: bool = True) -> dict:
    return {
        "prompt": [{"role": "user", "content": "Fix add() in calc.py."}],
        "label": "",
        "metadata": {
            "instance_id": "sweflow__calclib-1",
            "repo": "sweflow/calclib",
            "base_commit": base_commit,
            "sandbox_image": "fake-template",
            "blackbox_type": "claude_code",
            "sandbox_timeout_sec": 120,
            "backend_options": {"max_turns": 5, "permission_mode": "acceptEdits"},
            "blackbox_execute_cmds": {
                "before_agent": [
                    {"name": "git_sanitizer", "cmd": sanitizer, "required": required, "timeout": 30}
                ],
                "after_agent": [{"name": "harness_eval", "cmd": "true", "required": True, "timeout": 60}],
            },
        },
    }
