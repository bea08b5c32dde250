"""Claude Code's backend options: validated (`ClaudeCodeOptions.parse`), then the CLI's argv and environment.

`build_argv` and `build_env` turn the options of one blackbox session into a `claude -p ... --output-format
stream-json` command line and its environment (credentials dropped, model traffic routed to the proxy).
Standard library only: it runs inside the sandbox with the blackbox server.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Any

# How each backend option reaches the CLI (checked against Claude Code 2.1.332):
# - setting_sources -> `--setting-sources user,...`; system_prompt + system_prompt_mode ->
#   `--append-system-prompt` (append: after Claude Code's own prompt) or `--system-prompt` (replace);
# - auto_compact -> `autoCompactEnabled` in ~/.claude/settings.json and ~/.claude.json; false also sets
#   DISABLE_AUTO_COMPACT=1 and DISABLE_COMPACT=1 (the latter also removes /compact);
# - compact_at_tokens (with auto_compact) -> CLAUDE_CODE_AUTO_COMPACT_WINDOW + CLAUDE_AUTOCOMPACT_PCT_OVERRIDE
#   so that the CLI compacts once a response's usage reaches that many tokens (see `compaction_env`);
# - prompt_caching=false -> DISABLE_PROMPT_CACHING=1 (no `cache_control` in requests);
# - disable_nonessential_traffic -> CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 (+ telemetry, error reports);
# - subagents=false -> `--disallowedTools` with the sub-agent tools (`Agent`, its old name `Task`, `Workflow`).
# - tools -> `--tools A,B` (only these built-in tools; their schemas are the bulk of the prompt).
PERMISSION_MODES = ("acceptEdits", "auto", "bypassPermissions", "default", "dontAsk", "manual", "plan")
SETTING_SOURCES = ("user", "project", "local")
SYSTEM_PROMPT_MODES = ("append", "replace")
# The tools through which the model starts other agents (`Task` is the name before 2.x).
SUBAGENT_TOOLS = ("Agent", "Task", "Workflow")
DEFAULT_MAX_TURNS = 80
DEFAULT_PERMISSION_MODE = "acceptEdits"
DEFAULT_TEMPLATE_BINARY = "/usr/local/bin/claude"
BINARY_ENV = "SWEFLOW_CLAUDE_BIN"
# Inherited variables the agent must never see: credentials, markers of an enclosing Claude Code, and
# switches that backend options decide.
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)
_DROP_PREFIXES = (
    "ANTHROPIC_",
    "CLAUDE_CODE_",
    "CLAUDECODE",
    "CLAUDE_CONFIG_DIR",
    "DISABLE_PROMPT_CACHING",
    "ENABLE_PROMPT_CACHING",
    "DISABLE_AUTO_COMPACT",
    "DISABLE_COMPACT",
    "CLAUDE_AUTOCOMPACT_",
    "DISABLE_TELEMETRY",
    "DISABLE_ERROR_REPORTING",
)
_BLACKBOX_SECRET_PREFIX = "SWEFLOW_BLACKBOX_TOKEN"  # the server's own token: never for the agent

# Older spellings (published rows use them) -> the option they set.
_ALIASES = {
    "append_system_prompt": "system_prompt_append",
    "timeout": "turn_timeout",
    "claude_binary": "binary",
    "claude_path": "binary",
}
# Older switch spellings -> (option, whether the value is inverted).
_SWITCH_ALIASES = {
    "disable_prompt_caching": ("prompt_caching", True),
    "enable_prompt_caching": ("prompt_caching", False),
    "disable_compaction": ("auto_compact", True),
    "disable_auto_compact": ("auto_compact", True),
    "enable_compaction": ("auto_compact", False),
    "disable_subagents": ("subagents", True),
    "enable_subagents": ("subagents", False),
    "nonessential_traffic": ("disable_nonessential_traffic", True),
}
_SWITCHES = ("auto_compact", "prompt_caching", "disable_nonessential_traffic", "subagents")
OPTION_NAMES = (
    "working_directory",
    "max_turns",
    "permission_mode",
    "setting_sources",
    "system_prompt",
    "system_prompt_mode",
    "system_prompt_append",
    *_SWITCHES,
    "compact_at_tokens",
    "tools",
    "allowed_tools",
    "disallowed_tools",
    "model",
    "env",
    "turn_timeout",
    "binary",
    "max_retries",
    "api_timeout_ms",
    "extra_args",
)


class OptionError(ValueError):
    """A backend option has the wrong type or value, or is unknown; the message names the option."""


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


def _unknown(keys: list[str]) -> OptionError:
    known = list(OPTION_NAMES) + list(_ALIASES) + list(_SWITCH_ALIASES)
    parts = []
    for key in keys:
        near = difflib.get_close_matches(key, known, n=1)
        parts.append(f"{key!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    return OptionError(f"backend_options: unknown option {', '.join(parts)}")


@dataclass
class ClaudeCodeOptions:
    """Validated backend options for Claude Code; an absent option takes the schema's default."""

    working_directory: str
    max_turns: int = DEFAULT_MAX_TURNS
    permission_mode: str = DEFAULT_PERMISSION_MODE
    setting_sources: list[str] | None = field(default_factory=lambda: ["user"])  # None: the CLI's own
    system_prompt: str | None = None
    system_prompt_mode: str = "append"
    system_prompt_append: str | None = None  # older option: appended in either mode
    auto_compact: bool = False
    compact_at_tokens: int | None = None  # None: the CLI's own threshold
    prompt_caching: bool = False
    disable_nonessential_traffic: bool = True
    subagents: bool = False
    tools: list[str] | None = None  # None: the CLI's default set; names: only these built-in tools
    allowed_tools: list[str] = field(default_factory=list)
    disallowed_tools: list[str] = field(default_factory=list)
    model: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    turn_timeout: float | None = None
    binary: str | None = None
    max_retries: int | None = None  # API retries inside the CLI (CLAUDE_CODE_MAX_RETRIES)
    api_timeout_ms: int | None = None  # per-request API timeout (API_TIMEOUT_MS)
    extra_args: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, raw: dict[str, Any] | None, *, default_workdir: str) -> ClaudeCodeOptions:
        """Validate a register request's backend_options; raises OptionError naming the bad or unknown option.

        Older spellings are accepted (`disable_prompt_caching`, `enable_compaction`, ...); one that
        contradicts another spelling of the same option is an error. Without `system_prompt_mode`, a
        `system_prompt` keeps its older meaning (it replaces Claude Code's prompt).
        """
        if raw is not None and not isinstance(raw, dict):
            raise OptionError("backend_options: expected an object")
        raw = dict(raw or {})
        unknown = sorted(
            k for k in raw if k not in OPTION_NAMES and k not in _ALIASES and k not in _SWITCH_ALIASES
        )
        if unknown:
            raise _unknown(unknown)
        for alias, canon in _ALIASES.items():
            if alias in raw:
                value = raw.pop(alias)
                if canon in raw and raw[canon] != value:
                    raise OptionError(f"backend_options.{alias}: contradicts backend_options.{canon}")
                raw[canon] = value
        switches: dict[str, tuple[str, bool]] = {}
        for name in _SWITCHES:
            if name in raw:
                switches[name] = (name, _as_bool(name, raw.pop(name)))
        for alias, (canon, inverted) in _SWITCH_ALIASES.items():
            if alias in raw:
                value = _as_bool(alias, raw.pop(alias)) != inverted
                seen = switches.get(canon)
                if seen is not None and seen[1] != value:
                    raise OptionError(f"backend_options.{alias}: contradicts backend_options.{seen[0]}")
                switches[canon] = (alias, value)

        opts = cls(working_directory=str(raw.pop("working_directory", None) or default_workdir))
        if not os.path.isdir(opts.working_directory):
            raise OptionError(
                f"backend_options.working_directory: {opts.working_directory!r} is not a directory"
            )
        for canon, (_, value) in switches.items():
            setattr(opts, canon, value)
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
        if "tools" in raw:
            value = raw.pop("tools")
            opts.tools = None if value is None else _as_list("tools", value)
        if "setting_sources" in raw:
            value = raw.pop("setting_sources")
            opts.setting_sources = None if value is None else _as_list("setting_sources", value)
            bad = [s for s in opts.setting_sources or [] if s not in SETTING_SOURCES]
            if bad:
                raise OptionError(
                    f"backend_options.setting_sources: {bad[0]!r} is not one of {', '.join(SETTING_SOURCES)}"
                )
        for key in ("model", "system_prompt", "system_prompt_append", "binary"):
            if key in raw:
                value = raw.pop(key)
                if value is not None and not isinstance(value, str):
                    raise OptionError(f"backend_options.{key}: expected a string")
                setattr(opts, key, value or None)
        if "system_prompt_mode" in raw:
            value = raw.pop("system_prompt_mode")
            if value not in SYSTEM_PROMPT_MODES:
                raise OptionError(
                    f"backend_options.system_prompt_mode: {value!r} is not one of {', '.join(SYSTEM_PROMPT_MODES)}"
                )
            opts.system_prompt_mode = value
        elif opts.system_prompt:
            opts.system_prompt_mode = "replace"
        if opts.system_prompt_mode == "replace" and not opts.system_prompt:
            raise OptionError(
                "backend_options.system_prompt: system_prompt_mode replace needs a non-empty text"
            )
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
        if "compact_at_tokens" in raw:
            value = raw.pop("compact_at_tokens")
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1_000):
                raise OptionError(
                    "backend_options.compact_at_tokens: expected an integer of at least 1000 tokens"
                )
            opts.compact_at_tokens = value
        for key in ("max_retries", "api_timeout_ms"):
            if key in raw:
                value = raw.pop(key)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                    raise OptionError(f"backend_options.{key}: expected a non-negative integer")
                setattr(opts, key, value)
        if raw:  # a known name this parser forgot: still never silently ignored
            raise _unknown(sorted(raw))
        return opts

    def settings(self) -> dict[str, Any]:
        """The keys this session writes into the CLI's user settings (~/.claude/settings.json)."""
        return {"autoCompactEnabled": self.auto_compact}


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
    if opts.tools is not None:  # a short tool list is a short prompt (each tool's schema is sent each turn)
        argv += ["--tools", ",".join(opts.tools)]
    if opts.allowed_tools:
        argv += ["--allowedTools", ",".join(opts.allowed_tools)]
    disallowed = list(opts.disallowed_tools)
    if not opts.subagents:
        disallowed += [t for t in SUBAGENT_TOOLS if t not in disallowed]
    if disallowed:
        argv += ["--disallowedTools", ",".join(disallowed)]
    if opts.model:
        argv += ["--model", opts.model]
    appended = [opts.system_prompt_append]
    if opts.system_prompt_mode == "replace":
        argv += ["--system-prompt", opts.system_prompt or ""]
    else:
        appended.insert(0, opts.system_prompt)
    appended_text = "\n\n".join(t for t in appended if t)
    if appended_text:
        argv += ["--append-system-prompt", appended_text]
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
    """The agent's environment: inherited minus credentials, plus routing and the options' switches.

    `router_token` becomes ANTHROPIC_AUTH_TOKEN (the agent's only credential: its proxy session's secret).
    The switches of the options win over the same names in `opts.env`.
    """
    base = dict(os.environ if base is None else base)
    env = {k: v for k, v in base.items() if not k.startswith(_DROP_PREFIXES) and not _SECRET_NAME.search(k)}
    env.update({k: v for k, v in opts.env.items() if not k.startswith(_BLACKBOX_SECRET_PREFIX)})
    switched = (
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "DISABLE_TELEMETRY",
        "DISABLE_ERROR_REPORTING",
        "DISABLE_PROMPT_CACHING",
        "DISABLE_AUTO_COMPACT",
        "DISABLE_COMPACT",
    )
    for name in switched:
        env.pop(name, None)
    env.update(
        {
            "HOME": home,
            "XDG_CONFIG_HOME": os.path.join(home, ".config"),
            "XDG_CACHE_HOME": os.path.join(home, ".cache"),
            "ANTHROPIC_BASE_URL": router_url.rstrip("/"),
            "ANTHROPIC_AUTH_TOKEN": router_token,
            "DISABLE_AUTOUPDATER": "1",  # a sandbox never updates its CLI, whatever the options say
            "IS_SANDBOX": "1",
        }
    )
    if opts.disable_nonessential_traffic:
        env.update(
            {
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_TELEMETRY": "1",
                "DISABLE_ERROR_REPORTING": "1",
            }
        )
    if not opts.prompt_caching:
        env["DISABLE_PROMPT_CACHING"] = "1"
    if not opts.auto_compact:
        env["DISABLE_AUTO_COMPACT"] = "1"
        env["DISABLE_COMPACT"] = "1"
    elif opts.compact_at_tokens is not None:
        env.update(compaction_env(opts.compact_at_tokens))
    if opts.max_retries is not None:
        env["CLAUDE_CODE_MAX_RETRIES"] = str(opts.max_retries)
    if opts.api_timeout_ms is not None:
        env["API_TIMEOUT_MS"] = str(opts.api_timeout_ms)
    return env


# How Claude Code 2.1.332 places its auto-compaction threshold (measured through a scripted Messages API
# whose usage reports chosen token counts, tests/integration/test_blackbox_claude.py): a window W below
# 100,000 tokens is raised to 100,000; 20,000 are kept for the response; compaction fires at
# min(W - 20,000 - 13,000, (W - 20,000) x pct / 100). So no window alone gets below 67,000 tokens.
COMPACT_MIN_WINDOW = 100_000
COMPACT_RESPONSE_RESERVE = 20_000
COMPACT_SUMMARY_BUFFER = 13_000


def compaction_env(threshold: int) -> dict[str, str]:
    """The variables that make the CLI compact once a response's usage reaches ``threshold`` tokens."""
    window = max(threshold + COMPACT_RESPONSE_RESERVE + COMPACT_SUMMARY_BUFFER, COMPACT_MIN_WINDOW)
    pct = 100.0 * threshold / (window - COMPACT_RESPONSE_RESERVE)
    return {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(window), "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": f"{pct:.4f}"}
