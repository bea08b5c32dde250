"""The official `anthropic` SDK talks to the proxy: JSON, streaming, beta endpoint, token counting."""

from __future__ import annotations

import httpx
import pytest

from sweflow.offline.scripted_engine import ScriptedEngine
from sweflow.proxy.server import ProxyConfig, ProxyServer
from sweflow.proxy.toolcalls import format_qwen_xml

try:
    from tests.unit.conftest_proxy import tiny_tokenizer
except ModuleNotFoundError:  # default import mode: tests/unit itself is on sys.path
    from conftest_proxy import tiny_tokenizer  # type: ignore[no-redef]

anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed")

TOOLS = [
    {
        "name": "Bash",
        "description": "run",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]


def test_sdk_roundtrip_json_stream_and_beta():
    tok = tiny_tokenizer()
    turns = [format_qwen_xml("Bash", {"command": "pytest -rA"}), "Streaming answer text.", "beta ok"]
    with ProxyServer(ScriptedEngine(turns, tok), tok, ProxyConfig()) as proxy:
        admin = {"Authorization": f"Bearer {proxy.admin_token}"}
        token = httpx.post(proxy.url + "/session/create", json={"session_id": "sdk-1"}, headers=admin).json()[
            "token"
        ]
        client = anthropic.Anthropic(base_url=proxy.url, auth_token=token, api_key=None, max_retries=0)
        msg = client.messages.create(
            model="tiny",
            max_tokens=100,
            system="sys",
            tools=TOOLS,
            messages=[{"role": "user", "content": "test"}],
        )
        assert msg.stop_reason == "tool_use"
        assert msg.content[0].type == "tool_use" and msg.content[0].input == {"command": "pytest -rA"}
        with client.messages.stream(
            model="tiny", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            pieces = list(stream.text_stream)
            final = stream.get_final_message()
        assert "".join(pieces) == "Streaming answer text." and final.stop_reason == "end_turn"
        beta = client.beta.messages.create(
            model="tiny", max_tokens=50, messages=[{"role": "user", "content": "b"}]
        )
        assert beta.content[0].text == "beta ok"
        count = client.messages.count_tokens(model="tiny", messages=[{"role": "user", "content": "b"}])
        assert count.input_tokens > 0
        keyed = anthropic.Anthropic(base_url=proxy.url, api_key=token, max_retries=0)  # x-api-key works too
        assert keyed.messages.count_tokens(
            model="tiny", messages=[{"role": "user", "content": "x"}]
        ).input_tokens
        for wrong in ("nobody", "sdk-1"):  # a made-up key, or the session id, is no credential
            stranger = anthropic.Anthropic(base_url=proxy.url, api_key=wrong, max_retries=0)
            with pytest.raises(anthropic.AuthenticationError):
                stranger.messages.create(
                    model="tiny", max_tokens=5, messages=[{"role": "user", "content": "x"}]
                )
        assert len(proxy.read_trajectory("sdk-1")["turns"]) == 3
