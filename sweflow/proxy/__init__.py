"""Token-recording proxy: Anthropic Messages in, chat-template tokens to an engine, samples recorded.

In-process: `with ProxyServer(engine, tokenizer) as proxy:` (a session per agent run through the admin
endpoints, the agent pointed at `proxy.url`), or as a process: `python -m sweflow.proxy --help`.
torch/transformers load only for TransformersEngine.
"""

# Typical use (in-process):
#
#     from sweflow.proxy import ProxyServer, ProxyConfig, VLLMEngine
#     with ProxyServer(VLLMEngine("http://127.0.0.1:8000", "Qwen/Qwen3.5-4B"), tokenizer) as proxy:
#         admin = {"Authorization": f"Bearer {proxy.admin_token}"}
#         token = requests.post(proxy.url + "/session/create", json={"session_id": "r1"}, headers=admin).json()["token"]
#         # agent: ANTHROPIC_BASE_URL=proxy.url ANTHROPIC_AUTH_TOKEN=<token> claude -p ...
#         samples = requests.post(proxy.url + "/trajectory/read", json={"session_id": "r1"}, headers=admin).json()["samples"]
from sweflow.proxy.engines import (
    Engine,
    EngineError,
    EngineTimeout,
    GenerateResult,
    SamplingParams,
    TransformersEngine,
    VLLMEngine,
)
from sweflow.proxy.recorder import LinearizeConfig, SessionRecord, Turn, linearize
from sweflow.proxy.server import ProxyConfig, ProxyServer
from sweflow.proxy.toolcalls import ParsedOutput, ToolCall, format_hermes, format_qwen_xml, parse_tool_calls

__all__ = [
    "Engine",
    "EngineError",
    "EngineTimeout",
    "GenerateResult",
    "LinearizeConfig",
    "ParsedOutput",
    "ProxyConfig",
    "ProxyServer",
    "SamplingParams",
    "SessionRecord",
    "ToolCall",
    "TransformersEngine",
    "Turn",
    "VLLMEngine",
    "format_hermes",
    "format_qwen_xml",
    "linearize",
    "parse_tool_calls",
]
