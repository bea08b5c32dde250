"""Redaction for provenance records: no API key or token may reach a record, whatever the rule passes."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from sweflow.util import redact, secret_values

REDACTED = "***REDACTED***"

# Token formats worth catching even when the secret is not in this process's environment.
_TOKEN_PATTERNS = re.compile(
    r"(hf_[A-Za-z0-9]{20,}|sk-ant-[A-Za-z0-9_\-]{20,}|sk-[A-Za-z0-9]{32,}|e2b_[A-Za-z0-9]{20,}"
    r"|gh[pousr]_[A-Za-z0-9]{30,})"
)
# Parameter names that contain a secret marker (KEY, TOKEN, AUTH...) but name ordinary values in this project.
_BENIGN_KEY_WORDS = {"tokens", "tokenizer", "tokenizers", "author", "authors", "keys", "keyword", "keywords"}
_BENIGN_KEYS = re.compile(r"(^|_)(image|instance|sort|cache|dedup|group|partition|primary|join)_?key$", re.I)


def _key_is_secret(name: str) -> bool:
    words = [w for w in re.split(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])", str(name)) if w]
    if _BENIGN_KEYS.search(str(name)):
        return False
    return any(
        m in w.upper() and w.lower() not in _BENIGN_KEY_WORDS
        for w in words
        for m in ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
    )


def jsonable(value: Any) -> Any:
    """Plain JSON data from params/wildcards: paths and odd objects become strings, sets sorted lists."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted((jsonable(v) for v in value), key=repr)
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "items") and hasattr(value, "keys"):  # snakemake Namedlist and friends
        return {str(k): jsonable(v) for k, v in value.items()}
    return str(value)


def redact_value(value: Any, secrets: Iterable[str] | None = None, *, by_key: bool = True) -> Any:
    """Plain JSON data with secrets removed.

    String values under a secret-looking key (api_key, HF_TOKEN, password...) are replaced; numbers and
    booleans are kept (max_tokens=16000 is not a secret). Any string containing a secret value from the
    environment, or shaped like a known token (hf_..., sk-ant-...), has it replaced.
    """
    secrets = secret_values() if secrets is None else list(secrets)
    return _redact(jsonable(value), secrets, by_key)


def _redact(value: Any, secrets: list[str], by_key: bool) -> Any:
    if isinstance(value, str):
        return _TOKEN_PATTERNS.sub(REDACTED, redact(value, secrets))
    if isinstance(value, list):
        return [_redact(v, secrets, by_key) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            key = _redact(k, secrets, False)
            if by_key and _key_is_secret(k) and _has_strings(v):
                out[key] = REDACTED
            else:
                out[key] = _redact(v, secrets, by_key)
        return out
    return value


def _has_strings(value: Any) -> bool:
    if isinstance(value, str):
        return True
    if isinstance(value, list):
        return any(_has_strings(v) for v in value)
    if isinstance(value, dict):
        return any(_has_strings(v) for v in value.values())
    return False
