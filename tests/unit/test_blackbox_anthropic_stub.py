"""The scripted Anthropic Messages stand-in: SSE and JSON replies, script consumption, request recording."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.fakes.anthropic_stub import EXHAUSTED_TEXT, AnthropicStub, load_policy, text, tool_use, turn

READ_TOOL = {
    "name": "Read",
    "input_schema": {
        "type": "object",
        "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["file_path"],
        "additionalProperties": False,
    },
}


def post(url: str, body: dict, token: str | None = "sess-9") -> tuple[str, bytes]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.headers["Content-Type"], resp.read()


def parse_sse(raw: bytes) -> list[tuple[str, dict]]:
    events = []
    for chunk in raw.decode().strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def agent_request(stream: bool, messages: list | None = None) -> dict:
    return {
        "model": "m",
        "max_tokens": 100,
        "stream": stream,
        "tools": [READ_TOOL],
        "messages": messages or [{"role": "user", "content": "go"}],
    }


def test_streaming_reply_is_a_complete_sse_sequence():
    long_text = "x" * 100
    policy = [turn(text(long_text), tool_use("Read", {"file_path": "/testbed/a.py", "limit": 5}))]
    with AnthropicStub(policy) as stub:
        ctype, raw = post(f"{stub.url}/v1/messages?beta=true", agent_request(True))
    assert ctype == "text/event-stream"
    events = parse_sse(raw)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert all(name == data["type"] for name, data in events)
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert [b["type"] for b in starts] == ["text", "tool_use"] and starts[1]["name"] == "Read"
    text_out = "".join(
        d["delta"]["text"] for n, d in events if n == "content_block_delta" and d["index"] == 0
    )
    json_out = "".join(
        d["delta"]["partial_json"] for n, d in events if n == "content_block_delta" and d["index"] == 1
    )
    assert text_out == long_text
    assert json.loads(json_out) == {"file_path": "/testbed/a.py", "limit": 5}
    assert names.count("content_block_stop") == 2
    delta = dict(events)["message_delta"]
    assert delta["delta"]["stop_reason"] == "tool_use" and delta["usage"]["output_tokens"] > 0
    (rec,) = stub.requests
    assert rec.bearer == "sess-9" and rec.path == "/v1/messages?beta=true" and rec.turn_index == 0
    assert stub.errors == []


def test_json_replies_take_turns_in_order_with_unique_tool_ids():
    policy = [
        turn(tool_use("Read", {"file_path": "/a"})),
        turn(tool_use("Read", {"file_path": "/b"})),
        turn(text("done")),
    ]
    with AnthropicStub(policy) as stub:
        replies = [json.loads(post(f"{stub.url}/v1/messages", agent_request(False))[1]) for _ in range(3)]
    assert [r["stop_reason"] for r in replies] == ["tool_use", "tool_use", "end_turn"]
    ids = [r["content"][0]["id"] for r in replies[:2]]
    assert len(set(ids)) == 2 and all(i.startswith("toolu_") for i in ids)
    assert replies[2]["content"] == [{"type": "text", "text": "done"}]
    assert stub.turns_served == 3 and stub.errors == []


def test_side_requests_and_count_tokens_do_not_consume_the_script():
    with AnthropicStub([turn(text("only"))]) as stub:
        side = json.loads(
            post(f"{stub.url}/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "t"}]})[1]
        )
        count = json.loads(post(f"{stub.url}/v1/messages/count_tokens", agent_request(False))[1])
        main = json.loads(post(f"{stub.url}/v1/messages", agent_request(False))[1])
    assert side["content"][0]["type"] == "text" and count["input_tokens"] > 0
    assert main["content"] == [{"type": "text", "text": "only"}]
    assert [r.turn_index for r in stub.requests] == [None, None, 0]
    assert len(stub.agent_requests) == 1


def test_exhausted_script_and_bad_tool_inputs_are_reported():
    policy = [
        turn(tool_use("Read", {"path": "/a"})),  # wrong key: missing file_path, unknown path
        turn(tool_use("Frobnicate", {})),
    ]
    with AnthropicStub(policy) as stub:
        for _ in range(3):
            last = json.loads(post(f"{stub.url}/v1/messages", agent_request(False))[1])
    assert last["content"] == [{"type": "text", "text": EXHAUSTED_TEXT}] and last["stop_reason"] == "end_turn"
    errors = " | ".join(stub.errors)
    assert "missing required input 'file_path'" in errors and "unknown input 'path'" in errors
    assert "'Frobnicate' is not among" in errors and "script exhausted" in errors


def test_recorded_requests_expose_tool_results():
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "/a"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "body"}]},
    ]
    with AnthropicStub([turn(text("ok"))]) as stub:
        post(f"{stub.url}/v1/messages", agent_request(False, messages), token=None)
    (rec,) = stub.requests
    assert rec.bearer is None and rec.tool_names() == ["Read"]
    assert rec.tool_results() == [{"type": "tool_result", "tool_use_id": "t1", "content": "body"}]


def test_policy_validation():
    with pytest.raises(ValueError, match="unique"):
        AnthropicStub([turn(tool_use("Read", {}, id="a")), turn(tool_use("Read", {}, id="a"))])
    with pytest.raises(ValueError, match="unsupported block"):
        load_policy([[{"type": "image"}]])
    plain = load_policy([[text("a")], {"blocks": [text("b")], "stop_reason": "max_tokens"}])
    assert plain[1].resolved_stop_reason() == "max_tokens" and plain[0].resolved_stop_reason() == "end_turn"
