"""One small chat client for the synthesis LM calls, speaking the OpenAI and the Anthropic API.

`complete(settings, system, user)` sends one chat turn and returns the assistant's text. The API key is
read from the environment variable that `settings.api_key_env` names, at call time; it is never stored,
logged or put into an error.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SmithError
from ..schema import default
from ..util import redact, retry

APIS = ("openai", "anthropic")
ANTHROPIC_VERSION = "2023-06-01"
# Base of the exponential backoff between transport retries, in seconds (tests shorten it).
_BACKOFF = 1.0
_RETRY_STATUSES = frozenset({408, 429})
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class LMSettings:
    """Where and how to ask the LM; `api_key_env` is the NAME of the variable holding the key."""

    endpoint: str
    api: str = default("smith.lm.api")
    model: str = default("smith.lm.model")
    temperature: float = default("smith.lm.temperature")
    max_tokens: int = default("smith.lm.max_tokens")
    api_key_env: str | None = default("smith.lm.api_key_env")
    timeout_sec: float = default("smith.lm.timeout_sec")
    attempts: int = 3

    def record(self) -> dict[str, Any]:
        """What provenance and task metadata may show (never the key, nor credentials in the URL)."""
        return {
            "endpoint": redact(self.endpoint),
            "api": self.api,
            "model": self.model,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }


_FIELDS = ("endpoint", "api", "model", "temperature", "max_tokens", "api_key_env", "timeout_sec", "attempts")


def _number(cfg: Mapping, key: str, default: float, *, integer: bool, minimum: float) -> Any:
    value = cfg.get(key, default)
    ok_type = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_type) or value < minimum:
        kind = "an integer" if integer else "a number"
        raise SmithError(f"must be {kind} >= {minimum}, got {value!r}", field=key)
    return value


def lm_settings(cfg: Mapping) -> LMSettings:
    """LMSettings from a config mapping with the LMSettings field names; unknown keys are errors."""
    if not isinstance(cfg, Mapping):
        raise SmithError("LM settings must be a mapping", field="lm")
    if "api_key" in cfg:
        raise SmithError(
            "the key itself must not be in the configuration", field="api_key", hint="set api_key_env instead"
        )
    unknown = sorted(set(cfg) - set(_FIELDS))
    if unknown:
        raise SmithError(f"unknown LM settings {unknown}", field=str(unknown[0]), hint=f"known: {_FIELDS}")
    endpoint = cfg.get("endpoint")
    if not isinstance(endpoint, str) or urllib.parse.urlsplit(endpoint).scheme not in ("http", "https"):
        raise SmithError("must be an http(s) URL", field="endpoint")
    if not urllib.parse.urlsplit(endpoint).hostname:
        raise SmithError("URL has no host", field="endpoint")
    api = cfg.get("api", default("smith.lm.api"))
    if api not in APIS:
        raise SmithError(f"unknown API {api!r}", field="api", hint=f"one of {APIS}")
    model = cfg.get("model", default("smith.lm.model"))
    if not isinstance(model, str) or not model.strip():
        raise SmithError("must be a non-empty string", field="model")
    key_env = cfg.get("api_key_env")
    if key_env is not None and (not isinstance(key_env, str) or not _ENV_NAME.match(key_env)):
        # never echo the value: a key pasted here by mistake must not reach a log
        raise SmithError("must be the name of an environment variable", field="api_key_env")
    return LMSettings(
        endpoint=endpoint.rstrip("/"),
        api=api,
        model=model,
        temperature=float(_number(cfg, "temperature", 0.0, integer=False, minimum=0)),
        max_tokens=_number(cfg, "max_tokens", 4096, integer=True, minimum=1),
        api_key_env=key_env,
        timeout_sec=float(_number(cfg, "timeout_sec", 120, integer=False, minimum=0.001)),
        attempts=_number(cfg, "attempts", 3, integer=True, minimum=1),
    )


class _Transient(SmithError):
    """A failure worth retrying (5xx, 408/429, connection error, timeout)."""


def _api_key(settings: LMSettings) -> str | None:
    if not settings.api_key_env:
        return None
    key = (os.environ.get(settings.api_key_env) or "").strip()  # a key read from a file ends in a newline
    if key and any(c.isspace() or not c.isprintable() for c in key):
        # http.client would refuse the header and quote the key in its error: never send or echo it
        raise SmithError(
            f"environment variable {settings.api_key_env} (the LM API key) holds spaces or control characters",
            field="api_key_env",
        )
    if not key:
        raise SmithError(
            f"environment variable {settings.api_key_env} (the LM API key) is not set", field="api_key_env"
        )
    return key


def _request(settings: LMSettings, system: str, user: str, key: str | None) -> tuple[str, dict, dict]:
    base = settings.endpoint.rstrip("/")
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if settings.api == "anthropic":
        url = f"{base}/messages"
        headers["anthropic-version"] = ANTHROPIC_VERSION
        if key:
            headers["x-api-key"] = key
        body = {
            "model": settings.model,
            "max_tokens": settings.max_tokens,
            "temperature": settings.temperature,
            "system": system,
            "messages": [{"role": "user", "content": user}],
        }
    elif settings.api == "openai":
        url = f"{base}/chat/completions"
        if key:
            headers["Authorization"] = f"Bearer {key}"
        body = {
            "model": settings.model,
            "temperature": settings.temperature,
            "max_tokens": settings.max_tokens,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        }
    else:
        raise SmithError(f"unknown API {settings.api!r}", field="api", hint=f"one of {APIS}")
    return url, headers, body


def _opener(url: str) -> urllib.request.OpenerDirector:
    # A loopback endpoint (the scripted LM, a local server) never goes through an HTTP proxy.
    if urllib.parse.urlsplit(url).hostname in _LOOPBACK:
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener()


def _snippet(data: bytes, secrets: list[str]) -> str:
    # redact before cutting, so no prefix of a secret survives the cut
    return redact(" ".join(data.decode("utf-8", "replace").split()), secrets)[:200]


def _text(settings: LMSettings, payload: Any) -> str:
    try:
        if settings.api == "anthropic":
            parts = [b["text"] for b in payload["content"] if b.get("type") == "text"]
            if not parts:
                raise TypeError("no text block")
            return "".join(parts)
        content = payload["choices"][0]["message"]["content"]
        if not isinstance(content, str):
            raise TypeError("content is not text")
        return content
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise SmithError(
            f"LM reply from {redact(settings.endpoint)} has no assistant text ({type(exc).__name__})",
            field="endpoint",
        ) from None


# Transport failures (HTTP 5xx and 429, connection errors, timeouts) are retried with backoff; other 4xx
# answers are not. Every failure is one SmithError line naming the endpoint (credentials redacted) and the
# HTTP status.
def complete(settings: LMSettings, system: str, user: str) -> str:
    """One chat turn (system + user message); returns the assistant text."""
    key = _api_key(settings)
    secrets = [key] if key else []
    url, headers, body = _request(settings, system, user, key)
    where = redact(settings.endpoint, secrets)
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise SmithError("LM endpoint must be an http(s) URL", field="endpoint")
    data = json.dumps(body).encode("utf-8")
    opener = _opener(url)

    def once() -> str:
        req = urllib.request.Request(url, data=data, headers=headers, method="POST")
        try:
            with opener.open(req, timeout=settings.timeout_sec) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = _snippet(exc.read() or b"", secrets)
            status = exc.code
            kind = _Transient if status >= 500 or status in _RETRY_STATUSES else SmithError
            raise kind(f"LM request to {where} failed: HTTP {status}: {detail}", field="endpoint") from None
        except ValueError as exc:  # a header http.client refuses: its message would quote the header
            raise SmithError(
                f"LM request to {where} could not be sent ({type(exc).__name__})", field="endpoint"
            ) from None
        except (OSError, http.client.HTTPException) as exc:  # URLError, timeouts, resets, short reads
            reason = getattr(exc, "reason", exc)
            raise _Transient(
                f"LM request to {where} failed: no HTTP status ({type(exc).__name__}: "
                f"{redact(str(reason), secrets)})",
                field="endpoint",
            ) from None
        try:
            payload = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise SmithError(
                f"LM reply from {where} is not JSON: {_snippet(raw, secrets)}", field="endpoint"
            ) from None
        return _text(settings, payload)

    return retry(
        once,
        attempts=settings.attempts,
        backoff=_BACKOFF,
        retry_on=(_Transient,),
        what=f"LM request to {where}",
    )


_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([^\s`]*)[^`\n]*$")
_ALIASES = {"python": {"python", "py", "python3"}}


def code_block(text: str, lang: str = "python") -> str | None:
    """The content of the first closed fenced block tagged `lang` (or untagged), or None."""
    wanted = _ALIASES.get(lang.lower(), {lang.lower()}) | {""}
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i].rstrip("\r\n"))
        if not m:
            i += 1
            continue
        fence, tag = m.group(1), m.group(2).lower()
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if close.match(lines[j].rstrip("\r\n"))), None)
        if end is None:
            return None
        if tag in wanted:
            return "".join(lines[i + 1 : end])
        i = end + 1
    return None


def fence_block(code: str, lang: str = "python") -> str:
    """`code` in a fenced block (code_block's inverse) whose fence is longer than any backtick run in it."""
    fence = "`" * max([3] + [len(run) + 1 for run in re.findall(r"`{3,}", code)])
    body = code if code.endswith("\n") else code + "\n"
    return f"{fence}{lang}\n{body}{fence}\n"
