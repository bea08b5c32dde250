"""Claude Code adapter pieces: backend options, argv, environment, stream-json parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sweflow.blackbox.claude_code import prepare_home
from sweflow.blackbox.claude_options import (
    OPTION_NAMES,
    ClaudeCodeOptions,
    OptionError,
    build_argv,
    build_env,
)
from sweflow.blackbox.stream import event_outputs, parse_line

RECIPE = {
    "max_turns": 80,
    "permission_mode": "acceptEdits",
    "setting_sources": ["user"],
    "system_prompt_mode": "append",
    "auto_compact": False,
    "prompt_caching": False,
    "disable_nonessential_traffic": True,
    "subagents": False,
}
SCHEMA = Path(__file__).resolve().parents[2] / "config" / "schema.yaml"


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_recipe_options_reach_argv_env_and_settings(tmp_path):
    opts = ClaudeCodeOptions.parse(
        {"working_directory": str(tmp_path), **RECIPE, "system_prompt": "Work in /testbed."},
        default_workdir="/",
    )
    argv = build_argv("claude", opts, claude_session="u-1", resume=False, prompt=None)
    assert flag(argv, "--setting-sources") == "user"
    assert flag(argv, "--append-system-prompt") == "Work in /testbed." and "--system-prompt" not in argv
    assert flag(argv, "--disallowedTools") == "Agent,Task,Workflow"
    assert flag(argv, "--max-turns") == "80" and flag(argv, "--permission-mode") == "acceptEdits"
    assert flag(argv, "--session-id") == "u-1" and "--resume" not in argv
    base = {"PATH": "/bin", "DISABLE_TELEMETRY": "0"}
    env = build_env(opts, home="/h", router_url="http://r:1/", router_token="t", base=base)
    assert env["DISABLE_PROMPT_CACHING"] == "1"
    assert env["DISABLE_AUTO_COMPACT"] == "1" and env["DISABLE_COMPACT"] == "1"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and env["DISABLE_TELEMETRY"] == "1"
    assert env["ANTHROPIC_BASE_URL"] == "http://r:1" and env["PATH"] == "/bin"
    assert opts.settings() == {"autoCompactEnabled": False}

    # The opposite values: nothing of the above is set, even when inherited or given in `env`.
    on = ClaudeCodeOptions.parse(
        {
            "working_directory": str(tmp_path),
            "setting_sources": ["user", "project"],
            "auto_compact": True,
            "prompt_caching": True,
            "disable_nonessential_traffic": False,
            "subagents": True,
            "disallowed_tools": ["WebFetch"],
            "env": {"DISABLE_PROMPT_CACHING": "1"},
        },
        default_workdir="/",
    )
    argv = build_argv("claude", on, claude_session="u-1", resume=True, prompt="hi")
    assert argv[:3] == ["claude", "-p", "hi"] and flag(argv, "--resume") == "u-1"
    assert flag(argv, "--setting-sources") == "user,project" and flag(argv, "--disallowedTools") == "WebFetch"
    assert "--append-system-prompt" not in argv and "--system-prompt" not in argv
    inherited = {
        "PATH": "/bin",
        "DISABLE_COMPACT": "1",
        "DISABLE_AUTO_COMPACT": "1",
        "DISABLE_PROMPT_CACHING_OPUS": "1",
    }
    env = build_env(on, home="/h", router_url="http://r", router_token="t", base=inherited)
    switches = (
        "DISABLE_PROMPT_CACHING",
        "DISABLE_PROMPT_CACHING_OPUS",
        "DISABLE_AUTO_COMPACT",
        "DISABLE_COMPACT",
    )
    assert not set(switches) & set(env)
    assert "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC" not in env and env["DISABLE_AUTOUPDATER"] == "1"
    assert on.settings() == {"autoCompactEnabled": True}


@pytest.mark.parametrize("threshold", [57_536, 20_000, 67_000, 150_000])
def test_compact_at_tokens_places_the_clis_threshold(tmp_path, threshold):
    """The CLI's measured rule (claude_options.COMPACT_*): window raised to 100,000, 20,000 kept for the
    response, 13,000 of summary buffer, a percentage override below that; the variables put it there."""
    from sweflow.blackbox.claude_options import (
        COMPACT_MIN_WINDOW,
        COMPACT_RESPONSE_RESERVE,
        COMPACT_SUMMARY_BUFFER,
    )

    opts = ClaudeCodeOptions.parse(
        {"working_directory": str(tmp_path), "auto_compact": True, "compact_at_tokens": threshold},
        default_workdir="/",
    )
    inherited = {"PATH": "/bin", "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "5"}  # the host's own never leaks in
    env = build_env(opts, home="/h", router_url="http://r", router_token="t", base=inherited)
    window = max(int(env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"]), COMPACT_MIN_WINDOW)
    pct = float(env["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"])
    usable = window - COMPACT_RESPONSE_RESERVE
    fires_at = min(usable - COMPACT_SUMMARY_BUFFER, usable * pct / 100)
    assert abs(fires_at - threshold) < 1, (env, fires_at)
    # without auto_compact the threshold has no say: compaction is off
    off = ClaudeCodeOptions.parse(
        {"working_directory": str(tmp_path), "compact_at_tokens": threshold}, default_workdir="/"
    )
    env = build_env(off, home="/h", router_url="http://r", router_token="t", base={})
    assert env["DISABLE_AUTO_COMPACT"] == "1" and "CLAUDE_CODE_AUTO_COMPACT_WINDOW" not in env
    with pytest.raises(OptionError, match="compact_at_tokens"):
        ClaudeCodeOptions.parse(
            {"working_directory": str(tmp_path), "compact_at_tokens": "57k"}, default_workdir="/"
        )


def test_absent_options_take_the_schema_defaults(tmp_path):
    """The adapter and config/schema.yaml agree on names and defaults (a row without a key = a new row)."""
    props = yaml.safe_load(SCHEMA.read_text())["properties"]["agent"]["properties"]["backend_options"]
    assert props["additionalProperties"] is False
    names = set(props["properties"])
    assert names <= set(OPTION_NAMES) and set(OPTION_NAMES) - names == {"system_prompt_append"}
    opts = ClaudeCodeOptions.parse({}, default_workdir=str(tmp_path))
    for name, spec in props["properties"].items():
        if "default" in spec and name != "working_directory":
            assert getattr(opts, name) == spec["default"], name
    assert {k: getattr(opts, k) for k in RECIPE} == RECIPE


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"disable_prompt_caching": True}, {"prompt_caching": False}),
        ({"enable_prompt_caching": True}, {"prompt_caching": True}),
        ({"disable_compaction": False}, {"auto_compact": True}),
        ({"disable_auto_compact": True}, {"auto_compact": False}),
        ({"enable_compaction": True}, {"auto_compact": True}),
        ({"disable_subagents": False}, {"subagents": True}),
        ({"enable_subagents": False}, {"subagents": False}),
        ({"nonessential_traffic": True}, {"disable_nonessential_traffic": False}),
        ({"append_system_prompt": "be brief"}, {"system_prompt": "be brief", "system_prompt_mode": "append"}),
        ({"timeout": 30}, {"turn_timeout": 30}),
        ({"claude_path": "/opt/claude"}, {"binary": "/opt/claude"}),
        # Without a mode, `system_prompt` keeps its older meaning: it replaces Claude Code's prompt.
        (
            {"system_prompt": "You fix bugs."},
            {"system_prompt": "You fix bugs.", "system_prompt_mode": "replace"},
        ),
    ],
)
def test_older_spellings_of_published_rows_still_work(tmp_path, old, new):
    def run(raw):
        opts = ClaudeCodeOptions.parse({"working_directory": str(tmp_path), **raw}, default_workdir="/")
        argv = build_argv("claude", opts, claude_session="u", resume=False, prompt=None)
        env = build_env(opts, home="/h", router_url="http://r", router_token="t", base={})
        return opts.turn_timeout, opts.binary, argv, env, opts.settings()

    assert run(old) == run(new)


def test_older_append_and_system_prompt_together(tmp_path):
    opts = ClaudeCodeOptions.parse(
        {"working_directory": str(tmp_path), "system_prompt": "Base.", "system_prompt_append": "Extra."},
        default_workdir="/",
    )
    argv = build_argv("claude", opts, claude_session="u", resume=False, prompt=None)
    assert flag(argv, "--system-prompt") == "Base." and flag(argv, "--append-system-prompt") == "Extra."
    both = ClaudeCodeOptions.parse(
        {
            "working_directory": str(tmp_path),
            "system_prompt": "A.",
            "system_prompt_mode": "append",
            "append_system_prompt": "B.",
        },
        default_workdir="/",
    )
    argv = build_argv("claude", both, claude_session="u", resume=False, prompt=None)
    assert flag(argv, "--append-system-prompt") == "A.\n\nB." and "--system-prompt" not in argv


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"max_turn": 5}, "unknown option 'max_turn' (did you mean 'max_turns'?)"),
        ({"subagent": False, "zzz": 1}, "unknown option 'subagent' (did you mean 'subagents'?), 'zzz'"),
        (
            {"prompt_caching": False, "enable_prompt_caching": True},
            "enable_prompt_caching: contradicts backend_options.prompt_caching",
        ),
        (
            {"auto_compact": True, "disable_compaction": True},
            "disable_compaction: contradicts backend_options.auto_compact",
        ),
        ({"turn_timeout": 5, "timeout": 6}, "timeout: contradicts backend_options.turn_timeout"),
        (
            {"system_prompt_mode": "replace"},
            "system_prompt: system_prompt_mode replace needs a non-empty text",
        ),
        ({"system_prompt_mode": "prepend"}, "system_prompt_mode: 'prepend' is not one of append, replace"),
        (
            {"setting_sources": ["user", "global"]},
            "setting_sources: 'global' is not one of user, project, local",
        ),
    ],
)
def test_unknown_and_contradicting_options_are_errors(tmp_path, raw, message):
    with pytest.raises(OptionError) as err:
        ClaudeCodeOptions.parse({"working_directory": str(tmp_path), **raw}, default_workdir="/")
    assert message in str(err.value) and "\n" not in str(err.value)
    # Agreeing spellings of one option are fine.
    ok = ClaudeCodeOptions.parse(
        {"working_directory": str(tmp_path), "prompt_caching": True, "enable_prompt_caching": True},
        default_workdir="/",
    )
    assert ok.prompt_caching is True


def test_prepare_home_writes_the_settings_and_keeps_the_cli_state(tmp_path):
    home = tmp_path / "home"
    prepare_home(str(home), "/testbed", {"autoCompactEnabled": False})
    assert json.loads((home / ".claude" / "settings.json").read_text()) == {"autoCompactEnabled": False}
    seed = json.loads((home / ".claude.json").read_text())
    assert seed["autoCompactEnabled"] is False and seed["hasCompletedOnboarding"] is True
    assert seed["projects"]["/testbed"]["hasTrustDialogAccepted"] is True
    # The CLI adds its own state to ~/.claude.json; a later call keeps it and only sets our keys.
    (home / ".claude.json").write_text(json.dumps({**seed, "numStartups": 3}))
    (home / ".claude" / "settings.json").write_text(
        json.dumps({"theme": "dark", "autoCompactEnabled": False})
    )
    prepare_home(str(home), "/testbed", {"autoCompactEnabled": True})
    assert json.loads((home / ".claude.json").read_text())["numStartups"] == 3
    assert json.loads((home / ".claude.json").read_text())["autoCompactEnabled"] is True
    assert json.loads((home / ".claude" / "settings.json").read_text()) == {
        "theme": "dark",
        "autoCompactEnabled": True,
    }


def test_env_drops_inherited_credentials_but_keeps_explicit_env(tmp_path):
    opts = ClaudeCodeOptions.parse(
        {
            "working_directory": str(tmp_path),
            "env": {"MY_FLAG": "1", "SWEFLOW_BLACKBOX_TOKEN": "leak"},
        },
        default_workdir="/",
    )
    base = {
        "PATH": "/bin",
        "ANTHROPIC_API_KEY": "sk-x",
        "ANTHROPIC_MODEL": "other",
        "E2B_API_KEY": "e2b-x",
        "GITHUB_TOKEN": "gh-x",
        "CLAUDECODE": "1",
        "SWEFLOW_BLACKBOX_TOKEN_FILE": "/run/sweflow/blackbox.token",
    }
    env = build_env(opts, home="/h", router_url="http://r", router_token="sess-secret", base=base)
    assert env["ANTHROPIC_AUTH_TOKEN"] == "sess-secret" and env["MY_FLAG"] == "1" and env["IS_SANDBOX"] == "1"
    gone = ("ANTHROPIC_API_KEY", "ANTHROPIC_MODEL", "E2B_API_KEY", "GITHUB_TOKEN", "CLAUDECODE")
    for name in gone + ("SWEFLOW_BLACKBOX_TOKEN", "SWEFLOW_BLACKBOX_TOKEN_FILE"):
        assert name not in env


@pytest.mark.parametrize(
    "raw",
    [
        {"max_turns": True},
        {"max_turns": "5"},
        {"allowed_tools": [1]},
        {"model": 3},
        {"turn_timeout": 0},
        {"disable_subagents": "yes"},
        {"max_retries": -1},
        {"auto_compact": "no"},
        {"setting_sources": 3},
        {"system_prompt": ["x"]},
    ],
)
def test_bad_options_name_the_option(tmp_path, raw):
    with pytest.raises(OptionError, match=next(iter(raw))):
        ClaudeCodeOptions.parse({"working_directory": str(tmp_path), **raw}, default_workdir="/")


def test_event_outputs_and_line_parsing():
    assistant = {
        "type": "assistant",
        "message": {
            "content": [
                {"type": "thinking", "thinking": "hmm"},
                {"type": "text", "text": "t" * 20_000},
                {"type": "tool_use", "id": "a", "name": "Bash", "input": {"command": "ls"}},
            ]
        },
    }
    outs = event_outputs(assistant)
    assert [o["type"] for o in outs] == ["thinking", "text", "tool_use"]
    assert len(outs[1]["text"]) < 17_000 and "chars cut" in outs[1]["text"]
    user = {
        "type": "user",
        "message": {
            "content": [{"type": "tool_result", "tool_use_id": "a", "content": "x", "is_error": True}]
        },
    }
    assert event_outputs(user) == [
        {"type": "tool_result", "tool_use_id": "a", "content": "x", "is_error": True}
    ]
    assert event_outputs({"type": "result", "result": "done"}) == []
    assert parse_line("  \n") is None
    assert parse_line("[1]") == {"type": "raw", "line": "[1]"}
    assert parse_line('{"type": "system"}') == {"type": "system"}
