"""The Claude Code adapter: backend options -> `claude -p ... --output-format stream-json` runs.

One `ClaudeCodeAgent` per blackbox session. Each turn runs the CLI headless in the session's working
directory with a scratch HOME under the runtime directory, routes the model traffic to the registered
router URL with the registered router token (the proxy's per-session secret) as bearer, and parses the stream-json lines into outputs. Later turns
resume the same Claude conversation (`--resume <uuid>`; the uuid is fixed on the first turn with
`--session-id`). Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .procs import GroupProcess, TailBuffer
from .stream import TurnOutcome, event_outputs, parse_line

PERMISSION_MODES = ("acceptEdits", "auto", "bypassPermissions", "default", "dontAsk", "manual", "plan")
DEFAULT_MAX_TURNS = 80
DEFAULT_PERMISSION_MODE = "acceptEdits"
DEFAULT_TEMPLATE_BINARY = "/usr/local/bin/claude"
BINARY_ENV = "SWEFLOW_CLAUDE_BIN"
MAX_EVENT_LINE_CHARS = 2_000_000
# Inherited variables the agent must never see: credentials, and markers of an enclosing Claude Code.
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)
_DROP_PREFIXES = ("ANTHROPIC_", "CLAUDE_CODE_", "CLAUDECODE", "CLAUDE_CONFIG_DIR")
_BLACKBOX_SECRET_PREFIX = "SWEFLOW_BLACKBOX_TOKEN"  # the server's own token: never for the agent

# Option name -> accepted aliases (converters spell a few of these differently).
_ALIASES = {
    "system_prompt_append": ("append_system_prompt",),
    "turn_timeout": ("timeout",),
    "binary": ("claude_binary", "claude_path"),
    "disable_compaction": ("disable_auto_compact",),
}
_FLAG_KEYS = ("enable_prompt_caching", "enable_compaction", "enable_subagents", "nonessential_traffic")


class OptionError(ValueError):
    """A backend option has the wrong type or value; the message names the option."""


def _as_list(name: str, value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [p for p in re.split(r"[,\s]+", value) if p] if name != "extra_args" else [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise OptionError(f"backend_options.{name}: expected a string or a list of strings")


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise OptionError(f"backend_options.{name}: expected true or false")


@dataclass
class ClaudeCodeOptions:
    """Validated backend options for Claude Code; `ignored` lists keys the adapter does not know."""

    working_directory: str
    max_turns: int = DEFAULT_MAX_TURNS
    permission_mode: str = DEFAULT_PERMISSION_MODE
    allowed_tools: list[str] = field(default_factory=list)
    disallowed_tools: list[str] = field(default_factory=list)
    model: str | None = None
    system_prompt: str | None = None
    system_prompt_append: str | None = None
    setting_sources: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    turn_timeout: float | None = None
    binary: str | None = None
    disable_prompt_caching: bool = False
    disable_compaction: bool = False
    disable_subagents: bool = False
    max_retries: int | None = None  # API retries inside the CLI (CLAUDE_CODE_MAX_RETRIES)
    api_timeout_ms: int | None = None  # per-request API timeout (API_TIMEOUT_MS)
    extra_args: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, raw: dict[str, Any] | None, *, default_workdir: str) -> ClaudeCodeOptions:
        """Validate a register request's backend_options; raises OptionError naming the bad option."""
        if raw is not None and not isinstance(raw, dict):
            raise OptionError("backend_options: expected an object")
        raw = dict(raw or {})
        for canon, aliases in _ALIASES.items():
            for alias in aliases:
                if alias in raw and canon not in raw:
                    raw[canon] = raw.pop(alias)
        opts = cls(working_directory=str(raw.pop("working_directory", None) or default_workdir))
        if not os.path.isdir(opts.working_directory):
            raise OptionError(
                f"backend_options.working_directory: {opts.working_directory!r} is not a directory"
            )
        if "max_turns" in raw:
            value = raw.pop("max_turns")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise OptionError("backend_options.max_turns: expected a positive integer")
            opts.max_turns = value
        if "permission_mode" in raw:
            value = raw.pop("permission_mode")
            if value not in PERMISSION_MODES:
                raise OptionError(
                    f"backend_options.permission_mode: {value!r} is not one of {', '.join(PERMISSION_MODES)}"
                )
            opts.permission_mode = value
        for key in ("allowed_tools", "disallowed_tools", "extra_args"):
            if key in raw:
                setattr(opts, key, _as_list(key, raw.pop(key)))
        if "setting_sources" in raw:
            opts.setting_sources = _as_list("setting_sources", raw.pop("setting_sources"))
        for key in ("model", "system_prompt", "system_prompt_append", "binary"):
            if key in raw:
                value = raw.pop(key)
                if value is not None and not isinstance(value, str):
                    raise OptionError(f"backend_options.{key}: expected a string")
                setattr(opts, key, value or None)
        if "env" in raw:
            env = raw.pop("env")
            if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()
            ):
                raise OptionError("backend_options.env: expected an object of string values")
            opts.env = dict(env)
        if "turn_timeout" in raw:
            value = raw.pop("turn_timeout")
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
            ):
                raise OptionError("backend_options.turn_timeout: expected a positive number of seconds")
            opts.turn_timeout = float(value) if value is not None else None
        for key in ("max_retries", "api_timeout_ms"):
            if key in raw:
                value = raw.pop(key)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                    raise OptionError(f"backend_options.{key}: expected a non-negative integer")
                setattr(opts, key, value)
        for key in ("disable_prompt_caching", "disable_compaction", "disable_subagents"):
            if key in raw:
                setattr(opts, key, _as_bool(key, raw.pop(key)))
        # Positive spellings of the same switches.
        for key in _FLAG_KEYS:
            if key in raw:
                value = _as_bool(key, raw.pop(key))
                if key == "enable_prompt_caching":
                    opts.disable_prompt_caching = not value
                elif key == "enable_compaction":
                    opts.disable_compaction = not value
                elif key == "enable_subagents":
                    opts.disable_subagents = not value
                # nonessential_traffic: always off; accepted so converters may state it.
        opts.ignored = sorted(raw)
        return opts


def resolve_binary(option: str | None, server_default: str | None = None) -> str:
    """The Claude Code executable: backend option, server setting, $SWEFLOW_CLAUDE_BIN, `claude` on PATH, template path."""
    for candidate in (option, server_default, os.environ.get(BINARY_ENV)):
        if candidate:
            return candidate
    return shutil.which("claude") or DEFAULT_TEMPLATE_BINARY


def build_argv(
    binary: str, opts: ClaudeCodeOptions, *, claude_session: str, resume: bool, prompt: str | None
) -> list[str]:
    """The CLI argv for one turn; `prompt=None` means the prompt is fed on stdin (no argv size limit)."""
    argv = [binary, "-p"]
    if prompt is not None:
        argv.append(prompt)
    argv += ["--output-format", "stream-json", "--verbose"]
    argv += ["--max-turns", str(opts.max_turns), "--permission-mode", opts.permission_mode]
    argv += ["--resume", claude_session] if resume else ["--session-id", claude_session]
    if opts.allowed_tools:
        argv += ["--allowedTools", ",".join(opts.allowed_tools)]
    disallowed = list(opts.disallowed_tools)
    if opts.disable_subagents:
        disallowed += [t for t in ("Agent", "Task") if t not in disallowed]
    if disallowed:
        argv += ["--disallowedTools", ",".join(disallowed)]
    if opts.model:
        argv += ["--model", opts.model]
    if opts.system_prompt:
        argv += ["--system-prompt", opts.system_prompt]
    if opts.system_prompt_append:
        argv += ["--append-system-prompt", opts.system_prompt_append]
    if opts.setting_sources is not None:
        argv += ["--setting-sources", ",".join(opts.setting_sources)]
    return argv + list(opts.extra_args)


def build_env(
    opts: ClaudeCodeOptions,
    *,
    home: str,
    router_url: str,
    router_token: str,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """The agent's environment: inherited minus credentials, plus routing and quiet-mode switches.

    `router_token` becomes ANTHROPIC_AUTH_TOKEN (the agent's only credential: its proxy session's secret).
    """
    base = dict(os.environ if base is None else base)
    env = {k: v for k, v in base.items() if not k.startswith(_DROP_PREFIXES) and not _SECRET_NAME.search(k)}
    env.update({k: v for k, v in opts.env.items() if not k.startswith(_BLACKBOX_SECRET_PREFIX)})
    env.update(
        {
            "HOME": home,
            "XDG_CONFIG_HOME": os.path.join(home, ".config"),
            "XDG_CACHE_HOME": os.path.join(home, ".cache"),
            "ANTHROPIC_BASE_URL": router_url.rstrip("/"),
            "ANTHROPIC_AUTH_TOKEN": router_token,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "IS_SANDBOX": "1",
        }
    )
    if opts.disable_prompt_caching:
        env["DISABLE_PROMPT_CACHING"] = "1"
    if opts.disable_compaction:
        env["DISABLE_COMPACT"] = "1"
        env["DISABLE_AUTO_COMPACT"] = "1"
    if opts.max_retries is not None:
        env["CLAUDE_CODE_MAX_RETRIES"] = str(opts.max_retries)
    if opts.api_timeout_ms is not None:
        env["API_TIMEOUT_MS"] = str(opts.api_timeout_ms)
    return env


def prepare_home(home: str, working_directory: str) -> None:
    """Create the scratch HOME and pre-seed ~/.claude.json so no onboarding or trust prompt can appear."""
    os.makedirs(os.path.join(home, ".claude"), exist_ok=True)
    path = os.path.join(home, ".claude.json")
    if os.path.exists(path):
        return
    seed = {
        "hasCompletedOnboarding": True,
        "bypassPermissionsModeAccepted": True,
        "projects": {
            working_directory: {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}
        },
    }
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(seed, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)


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
        prepare_home(self.home, opts.working_directory)

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
