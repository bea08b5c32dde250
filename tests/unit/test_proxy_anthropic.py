"""Anthropic Messages <-> chat messages, request validation, response blocks and SSE events."""

from __future__ import annotations

import json

import pytest

from sweflow.proxy import anthropic as an
from sweflow.proxy.toolcalls import ToolCall

CONVERSION_TABLE = [
    # (system, messages, expected chat messages)
    (
        "S",
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
    ),
    (
        [
            {"type": "text", "text": "a"},
            {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}},
        ],
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "<system-reminder>r"}],
            }
        ],
        [{"role": "system", "content": "a\nb"}, {"role": "user", "content": "x\n<system-reminder>r"}],
    ),
    (
        None,
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "Running."},
                    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {"file_path": "/a"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "x=1"}],
                    },
                    {"type": "text", "text": "continue"},
                ],
            },
            {"role": "system", "content": "mid-list note"},
        ],
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "Running.",
                "reasoning_content": "hmm",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "Bash", "arguments": {"command": "ls"}},
                    },
                    {
                        "id": "toolu_2",
                        "type": "function",
                        "function": {"name": "Read", "arguments": {"file_path": "/a"}},
                    },
                ],
            },
            {"role": "tool", "content": "a.py", "tool_call_id": "toolu_1", "name": "Bash"},
            {"role": "tool", "content": "x=1", "tool_call_id": "toolu_2", "name": "Read"},
            {"role": "user", "content": "continue"},
            {"role": "system", "content": "mid-list note"},
        ],
    ),
    (
        None,
        [
            {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image", "source": {}}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t9", "name": "Bash", "input": {}}]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t9", "content": "boom", "is_error": True}
                ],
            },
        ],
        [
            {"role": "user", "content": "see\n[image omitted]"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "t9", "type": "function", "function": {"name": "Bash", "arguments": {}}}
                ],
            },
            {"role": "tool", "content": "Error: boom", "tool_call_id": "t9", "name": "Bash"},
        ],
    ),
]


@pytest.mark.parametrize(("system", "messages", "expected"), CONVERSION_TABLE)
def test_to_chat_messages_table(system, messages, expected):
    assert an.to_chat_messages(system, messages) == expected


def test_to_chat_tools_maps_schema_and_drops_server_tools():
    tools = [
        {"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {}}},
        {"type": "web_search_20250305", "name": "web_search"},
    ]
    assert an.to_chat_tools(tools) == [
        {
            "type": "function",
            "function": {
                "name": "Bash",
                "description": "run",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]


GOOD = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"messages": []}, "messages"),
        ({"messages": None}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"text": "x"}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "9"}, "max_tokens"),
        ({"tools": [{"description": "x"}]}, "tools"),
        ({"temperature": "hot"}, "temperature"),
    ],
)
def test_parse_request_rejects_with_field(patch, field):
    with pytest.raises(an.RequestError) as err:
        an.parse_request({**GOOD, **patch})
    assert err.value.field == field


def test_parse_request_accepts_minimal_and_count_tokens_shape():
    req = an.parse_request({**GOOD, "stream": True, "temperature": 0.5})
    assert req.stream and req.temperature == 0.5 and req.max_tokens == 5
    assert (
        an.parse_request({"model": "m", "messages": GOOD["messages"]}, require_max_tokens=False).max_tokens
        == 0
    )
    with pytest.raises(an.RequestError):
        an.parse_request([1, 2])


def test_stop_reason_mapping():
    assert an.stop_reason_for("stop", True) == "tool_use"
    assert an.stop_reason_for("stop", False) == "end_turn"
    assert an.stop_reason_for("length", False) == "max_tokens"
    assert an.stop_reason_for("length", True) == "max_tokens"


def test_content_blocks_have_unique_tool_ids():
    calls = [ToolCall("Bash", {"command": "ls"}) for _ in range(50)]
    blocks = an.content_blocks("hi", calls)
    assert blocks[0] == {"type": "text", "text": "hi"}
    ids = [b["id"] for b in blocks[1:]]
    assert len(set(ids)) == 50 and all(i.startswith("toolu_") for i in ids)
    assert an.content_blocks("", []) == []


def test_sse_event_sequence_and_reassembly():
    text = "x" * (an.TEXT_CHUNK_CHARS * 2 + 3)
    blocks = an.content_blocks(text, [ToolCall("Edit", {"file_path": "/a", "n": 2})])
    msg = an.build_message(model="m", blocks=blocks, stop_reason="tool_use", input_tokens=11, output_tokens=7)
    events = an.sse_events(msg)
    names = [e for e, _ in events]
    assert names == (
        ["message_start", "content_block_start"]
        + ["content_block_delta"] * 3
        + ["content_block_stop", "content_block_start", "content_block_delta", "content_block_stop"]
        + ["message_delta", "message_stop"]
    )
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] == 11
    # a client accumulating the deltas reconstructs the blocks exactly
    texts = "".join(d["delta"]["text"] for e, d in events if e == "content_block_delta" and d["index"] == 0)
    partial = "".join(
        d["delta"]["partial_json"] for e, d in events if e == "content_block_delta" and d["index"] == 1
    )
    assert texts == text and json.loads(partial) == {"file_path": "/a", "n": 2}
    assert (
        events[-2][1]["delta"]["stop_reason"] == "tool_use" and events[-2][1]["usage"]["output_tokens"] == 7
    )
    frame = an.format_sse(*events[-1])
    assert frame == b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


def test_error_body_shape():
    assert an.error_body("invalid_request_error", "bad") == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "bad"},
    }
