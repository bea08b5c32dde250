"""Pass-through mode: the proxy forwards an agent's Messages requests to a real Anthropic-compatible endpoint.

Expert trajectories (SWE-smith's recipe) come from a strong model, not from the policy being trained. The
agent in its sandbox still talks to the proxy only, with its session token; the proxy forwards each request
to `Upstream.base_url` with the key read from the environment variable `api_key_env` (in this process's
memory only: never written, never logged, never sent into a sandbox) and records the full request and
response messages of every turn (`Turn.request` / `Turn.response`), which is what trajectories are made of.

Forwarding rules:
- the body goes as the agent sent it, except: `stream` false (the proxy answers a streaming client with the
  same event sequence it uses for its own engines), `model` replaced when `model` is set, and
  `metadata.user_id` set to the proxy session id (an opaque identifier the API documents for this);
- `anthropic-version` and `anthropic-beta` headers pass through (Claude Code's features need them);
- 429, 5xx and connection failures are retried `attempts` times with backoff; the final failure is an
  HTTP error to the agent (the rollout then aborts as `proxy_error`, never a verdict about the task);
- any text coming back from the upstream is scrubbed of the key before it is logged or returned.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from sweflow.errors import ConfigError
from sweflow.proxy.handler import HttpError

log = logging.getLogger("sweflow.proxy")

FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")
DEFAULT_VERSION = "2023-06-01"
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


class Upstream:
    """An Anthropic Messages endpoint the proxy forwards to (see the module docstring)."""

    passthrough = True

    def __init__(
        self,
        base_url: str,
        *,
        api_key_env: str | None = "ANTHROPIC_API_KEY",
        model: str | None = None,
        timeout_s: float = 600.0,
        attempts: int = 4,
        backoff_s: float = 2.0,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"upstream endpoint must be an http(s) URL, got {base_url!r}")
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

    def scrub(self, text: str) -> str:
        return text.replace(self._key, "[REDACTED]") if self._key else text

    def _headers(self, incoming: Mapping[str, str] | None) -> dict[str, str]:
        headers = {"content-type": "application/json", "anthropic-version": DEFAULT_VERSION}
        for name in FORWARDED_HEADERS:
            value = incoming.get(name) if incoming is not None else None
            if value:
                headers[name] = str(value)
        if self._key:
            headers["x-api-key"] = self._key
        return headers

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
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return json.loads(resp.read() or b"{}")
            except urllib.error.HTTPError as exc:
                detail = self.scrub(_error_message(exc))
                if exc.code not in RETRY_STATUS:
                    kind = "authentication_error" if exc.code in (401, 403) else "invalid_request_error"
                    raise HttpError(exc.code, kind, f"upstream {exc.code}: {detail}") from None
                last = f"upstream {exc.code}: {detail}"
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last = f"upstream unreachable: {self.scrub(str(getattr(exc, 'reason', exc)))}"
            log.warning("upstream attempt %d/%d failed: %s", attempt + 1, self.attempts, last)
        raise HttpError(502, "api_error", last)

    def forward_body(self, body: dict, session_id: str) -> dict:
        out = dict(body)
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
        if not isinstance(content, list) or any(
            not isinstance(b, dict) or not isinstance(b.get("type"), str) for b in content
        ):
            raise HttpError(502, "api_error", "upstream answered without a list of content blocks")
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

    def count_tokens(self, body: dict, headers: Mapping[str, str] | None = None) -> dict:
        out = {k: v for k, v in body.items() if k not in ("stream", "max_tokens", "metadata")}
        if self.model:
            out["model"] = self.model
        return self._post("/v1/messages/count_tokens", out, headers)


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        raw = exc.read()[:2000].decode("utf-8", "replace")
    except OSError:
        return exc.reason or ""
    try:
        err = json.loads(raw).get("error") or {}
        return str(err.get("message") or raw)[:300]
    except (ValueError, AttributeError):
        return raw[:300]


def upstream_from_settings(settings: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Upstream:
    """An Upstream from a config mapping: endpoint, model, api_key_env, timeout_s, attempts."""
    return Upstream(
        str(settings["endpoint"]),
        api_key_env=settings.get("api_key_env", "ANTHROPIC_API_KEY"),
        model=settings.get("model"),
        timeout_s=float(settings.get("timeout_s") or 600),
        attempts=int(settings.get("attempts") or 4),
        environ=environ,
    )
