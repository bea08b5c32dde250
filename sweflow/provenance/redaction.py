"""Redaction for provenance records: no API key or token may reach a record, whatever the rule passes."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from sweflow.util import REDACTED, is_secret_key, redact, secret_values


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
        return redact(value, secrets)
    if isinstance(value, list):
        return [_redact(v, secrets, by_key) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            key = _redact(k, secrets, False)
            if by_key and is_secret_key(k) and _has_strings(v):
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
