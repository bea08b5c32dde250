"""Blackbox sessions: registration rules, one agent turn or shell command at a time, abort, event log.

The HTTP layer (server.py) maps `ApiError` to `{"error": {"type", "message", ...}}` with its status code.
Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .claude_code import ClaudeCodeAgent
from .claude_options import ClaudeCodeOptions, OptionError
from .procs import run_command

# The blackbox's own secret (and where it is kept) never reaches a child process.
SECRET_ENV_PREFIX = "SWEFLOW_BLACKBOX_TOKEN"

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")
AGENT_TYPES = ("claude_code",)
DEFAULT_TURN_TIMEOUT = 3600.0
DEFAULT_CMD_TIMEOUT = 600.0
MAX_EVENTS = 50_000
ERROR_TAIL_CHARS = 4_000


class ApiError(Exception):
    """An error answer: HTTP status, a short machine type, a one-line message, optional extra fields."""

    def __init__(self, status: int, kind: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.details = status, kind, message, details

    def body(self) -> dict[str, Any]:
        return {"error": {"type": self.kind, "message": self.message, **self.details}}


def check_id(value: Any, field_name: str) -> str:
    """Validate a session/instance id against ID_RE; raises ApiError 400 naming the field."""
    if not isinstance(value, str) or not ID_RE.match(value):
        raise ApiError(400, "invalid_request", f"{field_name}: must match {ID_RE.pattern}, got {value!r:.80}")
    return value


def content_to_prompt(content: Any) -> str:
    """A message's content (a string or a list of text blocks) as the agent's prompt text."""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for i, block in enumerate(content):
            if isinstance(block, str):
                parts.append(block)
            elif (
                isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)
            ):
                parts.append(block["text"])
            else:
                raise ApiError(400, "invalid_request", f"content[{i}]: only text blocks are supported")
        text = "\n\n".join(parts)
    else:
        raise ApiError(400, "invalid_request", "content: expected a string or a list of text blocks")
    if not text.strip():
        raise ApiError(400, "invalid_request", "content: empty prompt")
    return text


def positive_number(body: dict[str, Any], key: str, default: float | None) -> float | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ApiError(400, "invalid_request", f"{key}: expected a positive number of seconds")
    return float(value)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a command: ours plus `extra`, without the blackbox token variables."""
    env = {**os.environ, **(extra or {})}
    return {k: v for k, v in env.items() if not k.startswith(SECRET_ENV_PREFIX)}


@dataclass
class Session:
    """One registered rollout session and its agent; all mutable state is guarded by `lock`."""

    session_id: str
    instance_id: str | None
    agent_type: str
    router_url: str
    agent: ClaudeCodeAgent
    request_key: str  # canonical register body, for idempotency
    answer: dict[str, Any]
    default_turn_timeout: float
    created: float = field(default_factory=time.time)
    events: list[dict[str, Any]] = field(default_factory=list)
    events_dropped: int = 0
    turns: list[dict[str, Any]] = field(default_factory=list)
    last_error: dict[str, Any] | None = None
    turn_running: bool = False
    commands_running: int = 0
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    _cancels: list[threading.Event] = field(default_factory=list)

    @property
    def state(self) -> str:
        if self.closed:
            return "closed"
        if self.turn_running:
            return "running"
        return "executing" if self.commands_running else "idle"

    def _add_event(self, event: dict[str, Any]) -> None:
        with self.lock:
            self.events.append(event)
            if len(self.events) > MAX_EVENTS:
                cut = len(self.events) - MAX_EVENTS
                del self.events[:cut]
                self.events_dropped += cut

    def _fail(self, turn: int, err: ApiError) -> ApiError:
        with self.lock:
            self.last_error = {"turn": turn, "type": err.kind, "message": err.message, "time": time.time()}
        return err

    def send_message(self, body: dict[str, Any]) -> dict[str, Any]:
        """Run one agent turn synchronously; raises ApiError for busy (409), timeout (504), abort (409), crash (500)."""
        prompt = content_to_prompt(body.get("content"))
        timeout = positive_number(body, "timeout", self.agent.opts.turn_timeout or self.default_turn_timeout)
        cancel = threading.Event()
        with self.lock:
            if self.closed:
                raise ApiError(409, "session_closed", f"session {self.session_id} is closed")
            if self.turn_running or self.commands_running:
                raise ApiError(409, "session_busy", f"session {self.session_id} is {self.state}")
            self.turn_running = True
            self._cancels.append(cancel)
            turn = len(self.turns) + 1
            first_event = self.events_dropped + len(self.events)
        started = time.time()
        try:
            outcome = self.agent.run_turn(prompt, timeout=timeout, cancel=cancel, on_event=self._add_event)
        finally:
            with self.lock:
                self.turn_running = False
                self._cancels.remove(cancel)
        summary = outcome.summary()
        record = {
            "turn": turn,
            "started": started,
            "duration": summary["duration"],
            "status": "ok",
            "num_turns": summary["num_turns"],
            "is_error": summary["is_error"],
            "events_start": first_event,
            "events_count": outcome.events_count,
            "returncode": outcome.returncode,
        }
        err: ApiError | None = None
        stderr_tail = outcome.stderr_tail[-ERROR_TAIL_CHARS:]
        if outcome.reason == "timeout":
            record["status"] = "timeout"
            err = ApiError(
                504,
                "agent_timeout",
                f"turn {turn} ran past {timeout:g} s; the agent was killed",
                turn=turn,
                events_count=outcome.events_count,
                stderr_tail=stderr_tail,
            )
        elif outcome.reason == "aborted":
            record["status"] = "aborted"
            err = ApiError(
                409, "aborted", f"turn {turn} was aborted", turn=turn, events_count=outcome.events_count
            )
        elif outcome.crashed:
            record["status"] = "crashed"
            err = ApiError(
                500,
                "agent_crash",
                f"turn {turn}: the agent exited with code {outcome.returncode} without a result",
                turn=turn,
                returncode=outcome.returncode,
                stderr_tail=stderr_tail,
                events_count=outcome.events_count,
            )
        with self.lock:
            self.turns.append(record)
        if err is not None:
            raise self._fail(turn, err)
        return {"session_id": self.session_id, "turn": turn, **summary}

    def execute_cmd(self, body: dict[str, Any]) -> dict[str, Any]:
        """Run `bash -lc cmd` in the working directory (or `cwd`); refused with 409 while a turn runs."""
        cmd = body.get("cmd")
        if not isinstance(cmd, str) or not cmd.strip():
            raise ApiError(400, "invalid_request", "cmd: expected a non-empty string")
        timeout = positive_number(body, "timeout", DEFAULT_CMD_TIMEOUT)
        cwd = body.get("cwd") or self.agent.opts.working_directory
        if not isinstance(cwd, str) or not os.path.isdir(cwd):
            raise ApiError(400, "invalid_request", f"cwd: {cwd!r:.200} is not a directory")
        extra_env = body.get("env") or {}
        if not isinstance(extra_env, dict) or not all(isinstance(v, str) for v in extra_env.values()):
            raise ApiError(400, "invalid_request", "env: expected an object of string values")
        cancel = threading.Event()
        with self.lock:
            if self.closed:
                raise ApiError(409, "session_closed", f"session {self.session_id} is closed")
            if self.turn_running:
                raise ApiError(409, "session_busy", f"session {self.session_id} is running an agent turn")
            self.commands_running += 1
            self._cancels.append(cancel)
        try:
            result = run_command(cmd, cwd=cwd, env=child_env(extra_env), timeout=timeout, cancel=cancel)
        except OSError as exc:
            raise ApiError(500, "command_failed", f"cannot start bash: {exc}") from exc
        finally:
            with self.lock:
                self.commands_running -= 1
                self._cancels.remove(cancel)
        return result.to_dict()

    def abort(self) -> dict[str, Any]:
        """Cancel the running turn and commands; their pending requests answer promptly."""
        with self.lock:
            pending = list(self._cancels)
            state = self.state
        for cancel in pending:
            cancel.set()
        return {"session_id": self.session_id, "aborted": bool(pending), "state_before": state}

    def snapshot(
        self, *, tail: int | None = None, since: int | None = None, events: bool = True
    ) -> dict[str, Any]:
        """The session's state, turns, last error and (a slice of) its stored events."""
        with self.lock:
            total = self.events_dropped + len(self.events)
            start = self.events_dropped
            if since is not None:
                start = max(start, min(since, total))
            if tail is not None:
                start = max(start, total - tail)
            picked = self.events[start - self.events_dropped :] if events else []
            return {
                "session_id": self.session_id,
                "instance_id": self.instance_id,
                "agent_type": self.agent_type,
                "state": self.state,
                "created": self.created,
                "claude_session_id": self.agent.claude_session,
                "working_directory": self.agent.opts.working_directory,
                "turns": list(self.turns),
                "last_error": self.last_error,
                "events_total": total,
                "events_start": start if events else total,
                "events": picked,
            }


class SessionManager:
    """Owns the sessions of one server: register (idempotent), lookup, close, status."""

    def __init__(
        self,
        *,
        runtime_dir: str,
        max_sessions: int = 1,
        agent_binary: str | None = None,
        default_turn_timeout: float = DEFAULT_TURN_TIMEOUT,
        default_workdir: str | None = None,
    ) -> None:
        self.runtime_dir = runtime_dir
        self.max_sessions = max_sessions
        self.agent_binary = agent_binary
        self.default_turn_timeout = default_turn_timeout
        self.default_workdir = default_workdir or os.getcwd()
        self.sessions: dict[str, Session] = {}
        self.agent_type: str | None = None
        self.lock = threading.Lock()

    def register(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a session; the same body again answers the same; a conflicting one raises ApiError 409.

        `router_token` is the agent's bearer credential at `router_url` (the proxy's per-session token;
        default: the session id, which the sweflow proxy refuses). It is never echoed back.
        """
        agent_type = body.get("agent_type")
        if agent_type not in AGENT_TYPES:
            raise ApiError(
                400,
                "invalid_request",
                f"agent_type: expected one of {', '.join(AGENT_TYPES)}, got {agent_type!r:.80}",
            )
        session_id = check_id(body.get("session_id"), "session_id")
        instance_id = body.get("instance_id")
        if instance_id is not None:
            check_id(instance_id, "instance_id")
        router_url = body.get("router_url")
        if not isinstance(router_url, str) or not router_url.startswith(("http://", "https://")):
            raise ApiError(400, "invalid_request", "router_url: expected an http(s) URL")
        router_token = body.get("router_token", session_id)
        if not isinstance(router_token, str) or not router_token or len(router_token) > 4096:
            raise ApiError(400, "invalid_request", "router_token: expected a non-empty string")
        key = json.dumps(body, sort_keys=True)
        with self.lock:
            existing = self.sessions.get(session_id)
            if existing is not None:
                if existing.request_key == key:
                    return existing.answer
                raise ApiError(
                    409, "conflict", f"session {session_id} is already registered with a different body"
                )
            if len(self.sessions) >= self.max_sessions:
                open_ids = ", ".join(sorted(self.sessions))
                raise ApiError(
                    409,
                    "conflict",
                    f"server holds {self.max_sessions} session(s) already ({open_ids}); close one first",
                )
            try:
                opts = ClaudeCodeOptions.parse(
                    body.get("backend_options"), default_workdir=self.default_workdir
                )
            except OptionError as exc:
                raise ApiError(400, "invalid_request", str(exc)) from exc
            runtime = os.path.join(self.runtime_dir, session_id)
            agent = ClaudeCodeAgent(
                opts,
                session_id=session_id,
                router_url=router_url,
                router_token=router_token,
                runtime_dir=runtime,
                binary=self.agent_binary,
            )
            answer = {
                "registered": True,
                "session_id": session_id,
                "instance_id": instance_id,
                "agent_type": agent_type,
                "working_directory": opts.working_directory,
                "runtime_dir": runtime,
            }
            self.sessions[session_id] = Session(
                session_id, instance_id, agent_type, router_url, agent, key, answer, self.default_turn_timeout
            )
            self.agent_type = agent_type
            return answer

    def get(self, session_id: str) -> Session:
        with self.lock:
            session = self.sessions.get(session_id)
        if session is None:
            raise ApiError(404, "not_found", f"unknown session {session_id!r:.140}")
        return session

    def close(self, session_id: str) -> dict[str, Any]:
        """Abort whatever runs in the session and forget it (its runtime dir stays for inspection)."""
        session = self.get(session_id)
        session.abort()
        with session.lock:
            session.closed = True
        with self.lock:
            self.sessions.pop(session_id, None)
        return {"session_id": session_id, "closed": True}

    def abort_all(self) -> None:
        with self.lock:
            sessions = list(self.sessions.values())
        for session in sessions:
            session.abort()

    def status(self) -> dict[str, Any]:
        with self.lock:
            sessions = list(self.sessions.values())
        listed = [
            {
                "session_id": s.session_id,
                "instance_id": s.instance_id,
                "state": s.state,
                "turns": len(s.turns),
            }
            for s in sessions
        ]
        return {
            "agent_type": self.agent_type,
            "sessions": listed,
            "busy": any(s["state"] != "idle" for s in listed),
            "max_sessions": self.max_sessions,
        }
