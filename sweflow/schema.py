"""config/schema.yaml, the one source of every default.

`schema()` is what configs are validated against; `default(path)` and `defaults(path, partial)` are how code
handed a config section that may be partial reads a default, instead of a copy of its own
(tests/unit/test_layout.py looks for copies). Imports nothing of sweflow, so any module may use it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

SCHEMA = Path(__file__).resolve().parent.parent / "config" / "schema.yaml"
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    return yaml.load(SCHEMA.read_text(encoding="utf-8"), Loader=_Loader)


def schema() -> dict[str, Any]:
    """The whole schema (a copy)."""
    return copy.deepcopy(_schema())


def fill_defaults(sch: Mapping[str, Any], data: Any) -> Any:
    """Fill `default`s in place (objects recursively, per-key schemas included); returns `data`."""
    if not isinstance(data, dict):
        return data
    props = sch.get("properties") or {}
    for name, sub in props.items():
        if name not in data and "default" in sub:
            data[name] = copy.deepcopy(sub["default"])
        if name in data:
            fill_defaults(sub, data[name])
    extra = sch.get("additionalProperties")
    if isinstance(extra, dict):
        for name, value in data.items():
            if name not in props:
                fill_defaults(extra, value)
    return data


def _node(parts: list[str]) -> Mapping[str, Any]:
    node: Mapping[str, Any] = _schema()
    for part in parts:
        props = node.get("properties") or {}
        node = props[part] if part in props else node["additionalProperties"]
    return node


def default(path: str) -> Any:
    """The schema's default of the key at dotted `path` (KeyError: the key has none)."""
    return copy.deepcopy(_node(path.split("."))["default"])


def defaults(path: str, partial: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`partial`, the config section at dotted `path`, with the schema's defaults filled in (a copy)."""
    return fill_defaults(_node(path.split(".")), copy.deepcopy(dict(partial or {})))


def section_settings(cls: type, path: str, partial: Mapping[str, Any] | None = None) -> Any:
    """A settings dataclass whose fields are the keys of the section at `path`, filled from `partial` and the
    schema's defaults (the one place their values come from)."""
    d = defaults(path, partial)
    return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


def check_spec_keys(cls: type, spec: Any, where: str) -> None:
    """Raise ConfigError unless `spec` (a settings object as written to a spec) is a mapping holding exactly
    the fields of the dataclass `cls`."""
    from .errors import ConfigError

    names = [f.name for f in dataclasses.fields(cls)]
    got = spec if isinstance(spec, Mapping) else {}
    missing, unknown = [n for n in names if n not in got], sorted(set(got) - set(names))
    if missing or unknown or not isinstance(spec, Mapping):
        raise ConfigError(
            f"{cls.__name__}: missing {missing}, unknown {unknown}", field=where, hint="rewrite the spec"
        )
