"""Pass-through mode: the proxy forwards an agent's Messages requests to a real Anthropic-compatible endpoint.

Expert trajectories (SWE-smith's recipe) come from a strong model. The agent still talks to the proxy only;
the proxy forwards each request with a key only it holds and records every turn's request and response.
What goes upstream and how is noted next to each piece (`FORWARDED_FIELDS`, `Upstream._post`, ...).
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from sweflow.errors import ConfigError
from sweflow.proxy.handler import HttpError
from sweflow.schema import default, defaults

log = logging.getLogger("sweflow.proxy")

# Forwarding rule: `anthropic-version` and `anthropic-beta` headers pass through (Claude Code's features need
# them), minus the betas that reach outside the conversation or change the price.
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")
DEFAULT_VERSION = "2023-06-01"
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


# Expert trajectories (SWE-smith's recipe) come from a strong model, not from the policy being trained. The
# agent in its sandbox still talks to the proxy only, with its session token; the proxy forwards each request
# to `Upstream.base_url` with the key read from the environment variable `api_key_env` (in this process's
# memory only: never written, never logged, never sent into a sandbox) and records the full request and
# response messages of every turn (`Turn.request` / `Turn.response`), which is what trajectories are made of.
class Upstream:
    """An Anthropic Messages endpoint the proxy forwards to (see the comments above it and its methods)."""

    passthrough = True

    def __init__(
        self,
        base_url: str,
        *,
        api_key_env: str | None = default("sft.collect.expert.api_key_env"),
        model: str | None = None,
        timeout_s: float = default("sft.collect.expert.timeout_s"),
        attempts: int = default("sft.collect.expert.attempts"),
        backoff_s: float = 2.0,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"upstream endpoint must be an http(s) URL, got {base_url!r}")
        host = urllib.parse.urlsplit(base_url).hostname or ""
        if base_url.startswith("http://") and host not in ("127.0.0.1", "localhost", "::1"):
            raise ConfigError(f"the upstream key would travel in clear: use https for {host}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = float(timeout_s)
        self.attempts = max(1, int(attempts))
        self.backoff_s = float(backoff_s)
        self.api_key_env = api_key_env
        key = env.get(api_key_env, "") if api_key_env else ""
        if api_key_env and not key.strip():
            raise ConfigError(f"the upstream API key variable {api_key_env} is not set")
        if key != key.strip() or "\n" in key:
            raise ConfigError(
                f"the upstream API key in {api_key_env} has surrounding whitespace or a newline"
            )
        self._key = key

    def __repr__(self) -> str:  # never the key
        return f"Upstream({self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    # Forwarding rule: any text coming back from the upstream, error or answer, is scrubbed of the key before
    # it is cut, logged or returned: the raw body, and every string once decoded (a JSON-escaped echo of the
    # key).
    def scrub(self, text: str) -> str:
        return text.replace(self._key, "[REDACTED]") if self._key else text

    def _headers(self, incoming: Mapping[str, str] | None) -> dict[str, str]:
        headers = {"content-type": "application/json", "anthropic-version": DEFAULT_VERSION}
        for name in FORWARDED_HEADERS:
            value = incoming.get(name) if incoming is not None else None
            if value and name == "anthropic-beta":
                kept = [b.strip() for b in str(value).split(",") if b.strip() and not _blocked_beta(b)]
                value = ",".join(kept)
            if value:
                headers[name] = str(value)
        if self._key:
            headers["x-api-key"] = self._key
        return headers

    # Forwarding rule: 429, 5xx and connection failures are retried `attempts` times with backoff; a read
    # timeout is not (the generation may be billed already); the final failure is an HTTP error to the agent
    # (the rollout then aborts as `proxy_error`, never a verdict about the task); redirects are never
    # followed; an http:// endpoint must be on this machine.
    def _post(self, path: str, body: dict, incoming: Mapping[str, str] | None) -> dict:
        data = json.dumps(body, ensure_ascii=False).encode()
        last = "no attempt"
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            req = urllib.request.Request(
                self.base_url + path, data=data, headers=self._headers(incoming), method="POST"
            )
            try:
                with _OPENER.open(req, timeout=self.timeout_s) as resp:
                    # scrubbed raw (the key as sent) and decoded (a JSON-escaped echo, \u0073k-... style)
                    return _scrub_obj(json.loads(self.scrub(resp.read().decode("utf-8")) or "{}"), self.scrub)
            except urllib.error.HTTPError as exc:
                if 300 <= exc.code < 400:  # never follow: the key would go wherever the redirect points
                    raise HttpError(502, "api_error", f"upstream answered a redirect ({exc.code})") from None
                detail = _error_message(exc, self.scrub)
                if exc.code in (401, 403):
                    raise HttpError(exc.code, "authentication_error", f"upstream {exc.code}") from None
                if exc.code not in RETRY_STATUS:
                    raise HttpError(
                        exc.code, "invalid_request_error", f"upstream {exc.code}: {detail}"
                    ) from None
                last = f"upstream {exc.code}: {detail}"
            except urllib.error.URLError as exc:  # no connection: nothing was generated, so retrying is free
                last = f"upstream unreachable: {self.scrub(str(exc.reason))[:300]}"
            except (TimeoutError, OSError, ValueError) as exc:
                # a read timeout or a broken answer after the request was sent: the generation may be billed
                # already, so it is not sent again
                raise HttpError(
                    504, "timeout_error", f"upstream failed mid-answer: {type(exc).__name__}"
                ) from None
            log.warning("upstream attempt %d/%d failed: %s", attempt + 1, self.attempts, last)
        raise HttpError(502, "api_error", last)

    # Forwarding rule: the body goes as the agent sent it, except: `stream` false (the proxy answers a
    # streaming client with the same event sequence it uses for its own engines), `model` replaced when
    # `model` is set, and `metadata.user_id` set to the proxy session id (an opaque identifier the API
    # documents for this).
    def forward_body(self, body: dict, session_id: str) -> dict:
        """What goes upstream: the allowed fields only, custom tools only (server tools, MCP servers and
        containers would give the sandbox a way to the internet that the integrity scan never sees)."""
        out = {k: v for k, v in body.items() if k in FORWARDED_FIELDS}
        if isinstance(out.get("messages"), list):
            out["messages"] = [_forwarded_message(m) for m in out["messages"]]
        if isinstance(out.get("system"), list):
            out["system"] = _forwarded_blocks(out["system"])
        if isinstance(out.get("tools"), list):
            out["tools"] = [
                t for t in out["tools"] if isinstance(t, dict) and t.get("type") in (None, "custom")
            ]
            if not out["tools"]:
                out.pop("tools")
                out.pop("tool_choice", None)
        thinking = out.get("thinking")
        if isinstance(thinking, dict) and isinstance(thinking.get("budget_tokens"), int):
            # the budget must stay below max_tokens (which the proxy may have lowered) and at least 1024
            room = int(out.get("max_tokens") or 0) - 1
            if room < 1024:
                out.pop("thinking")
            else:
                out["thinking"] = {**thinking, "budget_tokens": min(thinking["budget_tokens"], room)}
        out["stream"] = False
        if self.model:
            out["model"] = self.model
        metadata = dict(out.get("metadata") or {}) if isinstance(out.get("metadata"), dict) else {}
        metadata["user_id"] = session_id
        out["metadata"] = metadata
        return out

    def messages(self, body: dict, *, session_id: str, headers: Mapping[str, str] | None = None) -> dict:
        """One Messages call; the upstream's message object (checked for the fields the proxy needs)."""
        message = self._post("/v1/messages", self.forward_body(body, session_id), headers)
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or any(not _block_ok(b) for b in content):
            raise HttpError(
                502, "api_error", "upstream answered without a list of well-formed content blocks"
            )
        if any(b["type"] in ("server_tool_use", "mcp_tool_use") for b in content):
            raise HttpError(
                502, "api_error", "upstream used a server-side tool, which pass-through does not allow"
            )
        message.setdefault("type", "message")
        message.setdefault("role", "assistant")
        message.setdefault("stop_sequence", None)
        usage = message.get("usage") if isinstance(message.get("usage"), dict) else {}
        message["usage"] = {
            "input_tokens": int(usage.get("input_tokens") or 0),
            "output_tokens": int(usage.get("output_tokens") or 0),
            **{k: v for k, v in usage.items() if k not in ("input_tokens", "output_tokens")},
        }
        return message

    # Forwarding rule: `count_tokens` is answered here with an estimate (no upstream request).
    def count_tokens(self, body: dict, headers: Mapping[str, str] | None = None) -> dict:
        """An estimate made here (about 4 characters a token): a count upstream would be one more request
        the sandbox could make on the key's account, outside the session's request cap."""
        return {"input_tokens": len(json.dumps(body, ensure_ascii=False)) // 4}


# Forwarding rule: only the Messages fields of `FORWARDED_FIELDS` and custom tools go upstream (no server
# tools, MCP servers or containers: the sandbox's only way out is the conversation itself); an answer using a
# server-side tool is refused; of the content blocks only text, tool use/result and thinking go
# (`FORWARDED_BLOCKS`): a document or image block, which may name a URL for the upstream to fetch, becomes a
# text note.
#
# The Messages fields pass-through forwards (anything else, e.g. mcp_servers, container, context_management,
# service_tier, is dropped).
FORWARDED_FIELDS = frozenset(
    {"model", "max_tokens", "messages", "system", "tools", "tool_choice", "temperature", "top_p", "top_k",
     "stop_sequences", "thinking", "metadata"}
)  # fmt: skip
# Beta features that reach outside the conversation (servers, files, code execution, search) or change the
# price (1M context): never forwarded.
_BLOCKED_BETAS = ("mcp", "web-fetch", "web-search", "code-execution", "files-api", "context-1m", "computer-use",
                  "skills", "container", "context-management")  # fmt: skip


# Content blocks that go upstream. Anything else (document, image, search_result, container_upload, ...)
# can name a URL the upstream would fetch (a way to the internet and to the solution) and becomes a
# text note saying what was left out.
FORWARDED_BLOCKS = frozenset({"text", "tool_use", "tool_result", "thinking", "redacted_thinking"})


def _forwarded_blocks(blocks: list) -> list:
    out = []
    for b in blocks:
        kind = b.get("type") if isinstance(b, dict) else None
        if kind not in FORWARDED_BLOCKS:
            out.append({"type": "text", "text": f"[a {kind or 'malformed'} block is not forwarded]"})
        elif kind == "tool_result" and isinstance(b.get("content"), list):
            out.append({**b, "content": _forwarded_blocks(b["content"])})
        else:
            out.append(b)
    return out


def _forwarded_message(m: Any) -> Any:
    if isinstance(m, dict) and isinstance(m.get("content"), list):
        return {**m, "content": _forwarded_blocks(m["content"])}
    return m


def _scrub_obj(obj: Any, scrub: Any) -> Any:
    """Every string of a decoded JSON value (keys included) through ``scrub``."""
    if isinstance(obj, str):
        return scrub(obj)
    if isinstance(obj, list):
        return [_scrub_obj(v, scrub) for v in obj]
    if isinstance(obj, dict):
        return {scrub(str(k)): _scrub_obj(v, scrub) for k, v in obj.items()}
    return obj


def _blocked_beta(beta: str) -> bool:
    return any(word in beta.lower() for word in _BLOCKED_BETAS)


def _block_ok(b: Any) -> bool:
    if not isinstance(b, dict) or not isinstance(b.get("type"), str):
        return False
    if b["type"] == "text":
        return isinstance(b.get("text"), str)
    if b["type"] == "tool_use":
        return (
            isinstance(b.get("id"), str)
            and isinstance(b.get("name"), str)
            and isinstance(b.get("input"), dict)
        )
    if b["type"] == "thinking":
        return isinstance(b.get("thinking"), str)
    return True


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kw: Any) -> None:
        return None  # the 3xx surfaces as an HTTPError


# no redirects, and no *_proxy environment variables: the key goes to base_url and nowhere else
_OPENER = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))


def _error_message(exc: urllib.error.HTTPError, scrub: Any) -> str:
    try:
        raw = scrub(exc.read()[:4000].decode("utf-8", "replace"))
    except OSError:
        return scrub(str(exc.reason or ""))[:300]
    try:
        err = json.loads(raw).get("error") or {}
        return scrub(str(err.get("message") or raw))[:300]  # decoded: a JSON-escaped echo too
    except (ValueError, AttributeError):
        return raw[:300]


def upstream_from_settings(settings: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Upstream:
    """An Upstream from a config mapping: endpoint, model, api_key_env, timeout_s, attempts."""
    s = defaults("sft.collect.expert", settings)
    return Upstream(
        str(s["endpoint"]),
        api_key_env=s["api_key_env"],
        model=s["model"],
        timeout_s=float(s["timeout_s"]),
        attempts=int(s["attempts"]),
        environ=environ,
    )
