"""The proxy's pass-through mode: an agent's Messages requests forwarded to an Anthropic-compatible upstream
with a key only the proxy holds, every turn's request and response recorded, errors and retries."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from sweflow.errors import ConfigError
from sweflow.offline.scripted_lm import ReplyStatus, ScriptedLM
from sweflow.proxy import ProxyConfig, ProxyServer
from sweflow.proxy.passthrough import Upstream

KEY = "sk-ant-api03-planted-PASSTHROUGH-0123456789"
TOOLS = [{"name": "Read", "description": "read a file", "input_schema": {"type": "object", "properties": {
    "file_path": {"type": "string"}}, "required": ["file_path"]}}]  # fmt: skip


def _answer(request):
    body = request["body"]
    if not body.get("tools"):
        return "side answer"
    n = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if n == 0:
        return {
            "content": [
                {"type": "thinking", "thinking": "let me think", "signature": "sig-1"},
                {"type": "text", "text": "Reading."},
                {
                    "type": "tool_use",
                    "id": "toolu_a",
                    "name": "Read",
                    "input": {"file_path": "/testbed/a.py"},
                },
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 11, "output_tokens": 7},
        }
    return {"content": [{"type": "text", "text": "Done."}], "stop_reason": "end_turn"}


@pytest.fixture
def upstream_lm():
    with ScriptedLM(_answer, api_key=KEY) as lm:
        yield lm


def _proxy(lm, **kw):
    up = Upstream(lm.url.removesuffix("/v1"), api_key_env="K", environ={"K": KEY}, backoff_s=0.01, **kw)
    return ProxyServer(up, None, ProxyConfig())


def _session(proxy, sid="expert.task-1:0:abcd1234"):
    admin = {"Authorization": f"Bearer {proxy.admin_token}"}
    r = requests.post(proxy.url + "/session/create", json={"session_id": sid}, headers=admin, timeout=10)
    return r.json()["token"], admin


def _body(messages, **kw):
    return {"model": "claude-x", "max_tokens": 100, "messages": messages, "tools": TOOLS,
            "system": [{"type": "text", "text": "You are exact."}], **kw}  # fmt: skip


def test_forwards_with_the_proxy_key_and_records_whole_turns(upstream_lm):
    with _proxy(upstream_lm, model="claude-forced") as proxy:
        token, admin = _session(proxy)
        first = [{"role": "user", "content": "fix it"}]
        r = requests.post(proxy.url + "/v1/messages", json=_body(first),
                          headers={"x-api-key": token, "anthropic-beta": "b1"}, timeout=10)  # fmt: skip
        assert r.status_code == 200, r.text
        msg = r.json()
        assert [b["type"] for b in msg["content"]] == ["thinking", "text", "tool_use"]
        second = first + [
            {"role": "assistant", "content": msg["content"]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "x = 1"}],
            },
        ]
        r2 = requests.post(
            proxy.url + "/v1/messages", json=_body(second), headers={"x-api-key": token}, timeout=10
        )
        assert r2.json()["content"] == [{"type": "text", "text": "Done."}]
        traj = requests.post(proxy.url + "/trajectory/read", json={"session_id": "expert.task-1:0:abcd1234"},
                             headers=admin, timeout=10).json()  # fmt: skip
    # the upstream saw the proxy's key (it answers 401 otherwise), the forced model, stream off and the
    # session id as metadata.user_id; the agent's own token never left the proxy
    sent = list(upstream_lm.bodies)
    assert [b["model"] for b in sent] == ["claude-forced", "claude-forced"]
    assert all(b["stream"] is False and b["metadata"]["user_id"] == "expert.task-1:0:abcd1234" for b in sent)
    assert token not in json.dumps(sent)
    assert traj["samples"] == []  # no tokens in pass-through
    turns = traj["turns"]
    assert [t["stop_reason"] for t in turns] == ["tool_use", "end_turn"]
    assert turns[0]["tool_calls"] == [{"name": "Read", "input": {"file_path": "/testbed/a.py"}}]
    assert turns[1]["request"]["messages"] == second
    assert turns[1]["request"]["system"] == [{"type": "text", "text": "You are exact."}]
    assert turns[0]["response"]["content"][0] == {
        "type": "thinking",
        "thinking": "let me think",
        "signature": "sig-1",
    }
    assert KEY not in json.dumps(traj)


def test_streaming_clients_get_every_block_back(upstream_lm):
    anthropic = pytest.importorskip("anthropic")
    with _proxy(upstream_lm) as proxy:
        token, _ = _session(proxy)
        client = anthropic.Anthropic(base_url=proxy.url, api_key=token, max_retries=0)
        with client.messages.stream(**_body([{"role": "user", "content": "fix it"}])) as stream:
            final = stream.get_final_message()
    kinds = [b.type for b in final.content]
    assert kinds == ["thinking", "text", "tool_use"]
    assert final.content[0].thinking == "let me think" and final.content[0].signature == "sig-1"
    assert final.content[2].input == {"file_path": "/testbed/a.py"} and final.stop_reason == "tool_use"


def test_upstream_errors_are_retried_then_reported_without_the_key():
    calls = []

    def flaky(request):
        calls.append(1)
        if len(calls) < 3:
            raise ReplyStatus(529, "overloaded")
        return "ok"

    with ScriptedLM(flaky, api_key=KEY) as lm, _proxy(lm) as proxy:
        token, _ = _session(proxy)
        r = requests.post(proxy.url + "/v1/messages", json=_body([{"role": "user", "content": "hi"}]),
                          headers={"x-api-key": token}, timeout=30)  # fmt: skip
        assert r.status_code == 200 and len(calls) == 3
    # a wrong key is an authentication error at once (no retry), and the key is never echoed
    with ScriptedLM(flaky, api_key="another-key") as lm:
        up = Upstream(lm.url.removesuffix("/v1"), api_key_env="K", environ={"K": KEY}, backoff_s=0.01)
        with ProxyServer(up, None) as proxy:
            token, _ = _session(proxy)
            r = requests.post(proxy.url + "/v1/messages", json=_body([{"role": "user", "content": "hi"}]),
                              headers={"x-api-key": token}, timeout=30)  # fmt: skip
    assert r.status_code == 401 and KEY not in r.text


class _EchoKey(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = json.dumps({"error": {"message": "bad key " + self.headers.get("x-api-key", "")}}).encode()
        self.send_response(400)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_an_upstream_that_echoes_the_key_has_it_scrubbed():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _EchoKey)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        up = Upstream(f"http://127.0.0.1:{srv.server_address[1]}", api_key_env="K", environ={"K": KEY})
        with ProxyServer(up, None) as proxy:
            token, _ = _session(proxy)
            r = requests.post(proxy.url + "/v1/messages", json=_body([{"role": "user", "content": "hi"}]),
                              headers={"x-api-key": token}, timeout=30)  # fmt: skip
        assert r.status_code == 400 and "[REDACTED]" in r.text and KEY not in r.text
        assert KEY not in repr(up)
    finally:
        srv.shutdown()


def test_a_missing_or_broken_key_is_a_config_error_naming_the_variable_only():
    with pytest.raises(ConfigError, match="MY_KEY is not set"):
        Upstream("https://api.example.com", api_key_env="MY_KEY", environ={})
    with pytest.raises(ConfigError, match="newline") as exc:
        Upstream("https://api.example.com", api_key_env="MY_KEY", environ={"MY_KEY": KEY + "\n"})
    assert KEY not in str(exc.value)
    with pytest.raises(ConfigError, match="http"):
        Upstream("api.example.com", api_key_env=None)


def test_the_agent_still_needs_its_session_token(upstream_lm):
    with _proxy(upstream_lm) as proxy:
        _session(proxy)
        r = requests.post(proxy.url + "/v1/messages", json=_body([{"role": "user", "content": "hi"}]),
                          headers={"x-api-key": KEY}, timeout=10)  # fmt: skip
    assert r.status_code == 401 and upstream_lm.requests == []


def test_the_proxy_caps_tokens_and_requests_per_session(upstream_lm):
    up = Upstream(upstream_lm.url.removesuffix("/v1"), api_key_env="K", environ={"K": KEY})
    with ProxyServer(up, None, ProxyConfig(max_new_tokens=50, max_session_requests=2)) as proxy:
        token, _ = _session(proxy)
        codes = [
            requests.post(
                proxy.url + "/v1/messages",
                json=_body([{"role": "user", "content": "hi"}], max_tokens=999),
                headers={"x-api-key": token},
                timeout=10,
            ).status_code  # fmt: skip
            for _ in range(3)
        ]
    assert codes == [200, 200, 429]
    assert [b["max_tokens"] for b in upstream_lm.bodies] == [50, 50]


def test_only_conversation_fields_and_custom_tools_go_upstream(upstream_lm):
    # server tools, MCP servers and containers would give the sandbox a way out; count_tokens is local
    with _proxy(upstream_lm) as proxy:
        token, _ = _session(proxy)
        tools = TOOLS + [{"type": "web_fetch_20250910", "name": "web_fetch"}, {"type": "web_search_20250305",
                                                                              "name": "web_search"}]  # fmt: skip
        body = _body([{"role": "user", "content": "hi"}], tools=tools, container="c1", service_tier="priority",
                     mcp_servers=[{"type": "url", "url": "https://attacker.example/mcp", "name": "x"}],
                     thinking={"type": "enabled", "budget_tokens": 64000})  # fmt: skip
        headers = {
            "x-api-key": token,
            "anthropic-beta": "claude-code-20250219,mcp-client-2025-04-04,context-1m-2025-08-07",
        }
        r = requests.post(proxy.url + "/v1/messages", json=body, headers=headers, timeout=10)
        assert r.status_code == 200, r.text
        n = requests.post(proxy.url + "/v1/messages/count_tokens", json=body, headers=headers, timeout=10)
        assert n.status_code == 200 and n.json()["input_tokens"] > 0
    [sent] = upstream_lm.bodies  # the count was answered here
    assert sent["tools"] == TOOLS
    assert not {"container", "service_tier", "mcp_servers"} & set(sent)
    assert "thinking" not in sent  # max_tokens 100 leaves no room for the 1024-token minimum budget


def test_redirects_are_not_followed_and_remote_http_is_refused():
    class Redirect(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):  # noqa: N802
            self.send_response(307)
            self.send_header("Location", "http://127.0.0.2:9/steal")
            self.send_header("Content-Length", "0")
            self.end_headers()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        up = Upstream(f"http://127.0.0.1:{srv.server_address[1]}", api_key_env="K", environ={"K": KEY})
        with pytest.raises(Exception, match="redirect"):
            up.messages({"model": "m", "max_tokens": 5, "messages": []}, session_id="s")
    finally:
        srv.shutdown()
    with pytest.raises(ConfigError, match="https"):
        Upstream("http://api.example.com", api_key_env="K", environ={"K": KEY})


def test_one_session_cannot_have_more_than_its_share_in_flight():
    gate = threading.Event()

    def slow(request):
        gate.wait(10)
        return "late"

    with ScriptedLM(slow, api_key=KEY) as lm:
        up = Upstream(lm.url.removesuffix("/v1"), api_key_env="K", environ={"K": KEY})
        with ProxyServer(up, None, ProxyConfig(max_session_in_flight=1, max_session_requests=5)) as proxy:
            token, _ = _session(proxy)
            codes = []

            def call():
                r = requests.post(proxy.url + "/v1/messages", json=_body([{"role": "user", "content": "hi"}]),
                                  headers={"x-api-key": token}, timeout=20)  # fmt: skip
                codes.append(r.status_code)

            threads = [threading.Thread(target=call) for _ in range(3)]
            for t in threads:
                t.start()
            for _ in range(100):
                if len(codes) >= 2:
                    break
                threading.Event().wait(0.05)
            gate.set()
            for t in threads:
                t.join()
    assert sorted(codes) == [200, 429, 429] and len(lm.bodies) == 1


def test_document_and_image_blocks_never_go_upstream(upstream_lm):
    """A URL source would have the upstream fetch from the internet for the sandbox (the solution too)."""
    url = "https://attacker.example/fix.patch"
    user = [
        {"type": "text", "text": "read this"},
        {"type": "document", "source": {"type": "url", "url": url}},
        {"type": "image", "source": {"type": "url", "url": url + ".png"}},
    ]
    result = {"type": "tool_result", "tool_use_id": "toolu_a", "content": [
        {"type": "text", "text": "x = 1"}, {"type": "image", "source": {"type": "url", "url": url}}]}  # fmt: skip
    with _proxy(upstream_lm) as proxy:
        token, _ = _session(proxy)
        body = _body(
            [{"role": "user", "content": user}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": [result]}],
            system=[{"type": "text", "text": "be exact"}, {"type": "document", "source": {"type": "url", "url": url}}],
        )  # fmt: skip
        r = requests.post(proxy.url + "/v1/messages", json=body, headers={"x-api-key": token}, timeout=10)
        assert r.status_code == 200, r.text
    [sent] = upstream_lm.bodies
    assert "attacker.example" not in json.dumps(sent)
    assert [b["type"] for b in sent["messages"][0]["content"]] == ["text", "text", "text"]
    assert sent["messages"][0]["content"][1]["text"] == "[a document block is not forwarded]"
    assert sent["messages"][2]["content"][0]["content"][0] == {"type": "text", "text": "x = 1"}
    assert sent["system"][0] == {"type": "text", "text": "be exact"}


class _EchoKeyOk(BaseHTTPRequestHandler):
    """A 200 answer carrying the key it was sent: once raw, once JSON-escaped (\\u0073k-...)."""

    def log_message(self, *a):
        pass

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = self.headers.get("x-api-key", "")
        escaped = "".join(f"\\u{ord(c):04x}" for c in key)
        data = (
            '{"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",'
            f' "content": [{{"type": "text", "text": "raw {key}"}}, {{"type": "text", "text": "esc {escaped}"}}],'
            ' "usage": {"input_tokens": 1, "output_tokens": 1}}'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_a_successful_answer_that_echoes_the_key_has_it_scrubbed_raw_and_decoded():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _EchoKeyOk)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        up = Upstream(f"http://127.0.0.1:{srv.server_address[1]}", api_key_env="K", environ={"K": KEY})
        with ProxyServer(up, None) as proxy:
            token, admin = _session(proxy)
            r = requests.post(proxy.url + "/v1/messages", json=_body([{"role": "user", "content": "hi"}]),
                              headers={"x-api-key": token}, timeout=30)  # fmt: skip
            traj = requests.post(proxy.url + "/trajectory/read", json={"session_id": "expert.task-1:0:abcd1234"},
                                 headers=admin, timeout=10).json()  # fmt: skip
        assert r.status_code == 200, r.text
        assert [b["text"] for b in r.json()["content"]] == ["raw [REDACTED]", "esc [REDACTED]"]
        assert KEY not in json.dumps(traj) and KEY not in r.text and "[REDACTED]" in json.dumps(traj)
    finally:
        srv.shutdown()
