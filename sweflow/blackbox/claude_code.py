"""The Claude Code adapter: one `ClaudeCodeAgent` per blackbox session runs the CLI's headless turns.

Each turn runs in the session's working directory with a scratch HOME under the runtime directory, its
model traffic routed to the router URL with the router token (the proxy's per-session secret) as bearer;
stream-json lines become outputs. Later turns `--resume` the conversation whose uuid the first fixed.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any

from .claude_options import ClaudeCodeOptions, build_argv, build_env, resolve_binary
from .procs import GroupProcess, TailBuffer
from .stream import TurnOutcome, event_outputs, parse_line

MAX_EVENT_LINE_CHARS = 2_000_000


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def prepare_home(home: str, working_directory: str, settings: dict[str, Any] | None = None) -> None:
    """Create the scratch HOME: ~/.claude.json pre-seeded (no onboarding or trust prompt) and `settings`
    written into ~/.claude/settings.json (user settings) and ~/.claude.json (the CLI's global config)."""
    settings = dict(settings or {})
    os.makedirs(os.path.join(home, ".claude"), exist_ok=True)
    user_settings = os.path.join(home, ".claude", "settings.json")
    _write_json(user_settings, {**(_read_json(user_settings) or {}), **settings})
    path = os.path.join(home, ".claude.json")
    seed = _read_json(path)
    if seed is None:
        seed = {
            "hasCompletedOnboarding": True,
            "bypassPermissionsModeAccepted": True,
            "projects": {
                working_directory: {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}
            },
        }
    elif all(seed.get(k) == v for k, v in settings.items()):
        return  # the CLI keeps its own state here: leave the file alone when nothing changes
    _write_json(path, {**seed, **settings})


class ClaudeCodeAgent:
    """Runs Claude Code turns for one blackbox session; not thread-safe (the session serialises turns)."""

    agent_type = "claude_code"

    def __init__(
        self,
        opts: ClaudeCodeOptions,
        *,
        session_id: str,
        router_url: str,
        runtime_dir: str,
        binary: str | None = None,
        router_token: str | None = None,
    ) -> None:
        self.opts = opts
        self.session_id = session_id
        self.router_url = router_url
        self._router_token = router_token or session_id
        self.home = os.path.join(runtime_dir, "home")
        self.binary = resolve_binary(opts.binary, binary)
        self.claude_session = str(uuid.uuid4())
        prepare_home(self.home, opts.working_directory, opts.settings())

    def has_transcript(self) -> bool:
        """Whether the CLI saved this conversation (then the next turn resumes it, else it starts it)."""
        projects = os.path.join(self.home, ".claude", "projects")
        try:
            return any(
                os.path.exists(os.path.join(projects, d, f"{self.claude_session}.jsonl"))
                for d in os.listdir(projects)
            )
        except OSError:
            return False

    def run_turn(
        self,
        prompt: str,
        *,
        timeout: float | None,
        cancel: threading.Event,
        on_event: Callable[[dict[str, Any]], None],
        on_start: Callable[[GroupProcess], None] | None = None,
    ) -> TurnOutcome:
        """Run one headless turn; never raises for agent failures (see TurnOutcome.reason / crashed)."""
        outputs: list[dict[str, Any]] = []
        state: dict[str, Any] = {"result": None, "count": 0}
        lock = threading.Lock()

        def handle(line: str) -> None:
            event = parse_line(line[:MAX_EVENT_LINE_CHARS])
            if event is None:
                return
            with lock:
                state["count"] += 1
                if event.get("type") == "system" and event.get("subtype") == "init":
                    if isinstance(event.get("session_id"), str):
                        self.claude_session = event["session_id"]
                elif event.get("type") == "result":
                    state["result"] = event
                outputs.extend(event_outputs(event))
            on_event(event)

        stderr = TailBuffer(8_000)
        # Prompts go on stdin: one argv string is capped at 128 KiB by the kernel.
        argv = build_argv(
            self.binary,
            self.opts,
            claude_session=self.claude_session,
            resume=self.has_transcript(),
            prompt=None,
        )
        env = build_env(
            self.opts, home=self.home, router_url=self.router_url, router_token=self._router_token
        )
        try:
            proc = GroupProcess(
                argv,
                cwd=self.opts.working_directory,
                env=env,
                on_stdout=handle,
                on_stderr=stderr.write,
                stdin_data=prompt.encode("utf-8"),
            )
        except OSError as exc:
            return TurnOutcome(
                "exited", None, 0.0, [], None, 0, f"cannot start {self.binary}: {exc}", self.claude_session
            )
        if on_start is not None:
            on_start(proc)
        outcome = proc.wait(timeout, cancel)
        with lock:
            return TurnOutcome(
                outcome.reason,
                outcome.returncode,
                outcome.duration,
                list(outputs),
                state["result"],
                state["count"],
                stderr.text(),
                self.claude_session,
            )
