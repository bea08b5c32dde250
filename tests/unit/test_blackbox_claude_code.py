"""Claude Code adapter pieces: backend options, argv, environment, stream-json parsing."""

from __future__ import annotations

import pytest

from sweflow.blackbox.claude_code import ClaudeCodeOptions, OptionError, build_argv, build_env
from sweflow.blackbox.stream import event_outputs, parse_line


def test_options_aliases_switches_and_ignored_keys(tmp_path):
    opts = ClaudeCodeOptions.parse(
        {
            "working_directory": str(tmp_path),
            "append_system_prompt": "be brief",
            "timeout": 30,
            "setting_sources": "",
            "enable_prompt_caching": False,
            "disable_compaction": True,
            "enable_subagents": False,
            "nonessential_traffic": False,
            "disallowed_tools": "WebFetch, WebSearch",
            "mystery": 1,
            "max_retries": 0,
            "api_timeout_ms": 600000,
        },
        default_workdir="/",
    )
    assert opts.system_prompt_append == "be brief" and opts.turn_timeout == 30.0
    assert opts.disable_prompt_caching and opts.disable_compaction and opts.disable_subagents
    assert opts.ignored == ["mystery"] and opts.max_turns == 80 and opts.permission_mode == "acceptEdits"
    argv = build_argv("claude", opts, claude_session="u-1", resume=False, prompt=None)
    assert argv[argv.index("--disallowedTools") + 1] == "WebFetch,WebSearch,Agent,Task"
    assert argv[argv.index("--setting-sources") + 1] == ""
    assert argv[argv.index("--append-system-prompt") + 1] == "be brief"
    assert argv[argv.index("--session-id") + 1] == "u-1" and "--resume" not in argv
    resumed = build_argv("claude", opts, claude_session="u-1", resume=True, prompt="hi")
    assert resumed[:3] == ["claude", "-p", "hi"] and resumed[resumed.index("--resume") + 1] == "u-1"
    env = build_env(opts, home="/h", router_url="http://r:1/", router_token="t", base={"PATH": "/bin"})
    assert env["DISABLE_PROMPT_CACHING"] == "1" and env["DISABLE_COMPACT"] == "1"
    assert env["CLAUDE_CODE_MAX_RETRIES"] == "0" and env["API_TIMEOUT_MS"] == "600000"
    assert env["ANTHROPIC_BASE_URL"] == "http://r:1" and env["PATH"] == "/bin"


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
