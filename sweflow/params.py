"""Rule params: the config values that can change a result, in one canonical form; operational ones apart.

Snakemake reruns a job when the repr of a param changes, so params carry only what config/keys.yaml calls
`result`, with keys sorted and integral floats written as integers: a scheduling knob, a resource limit
or a reordered YAML file plans no job.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

KEYS = Path(__file__).resolve().parent.parent / "config" / "keys.yaml"
KINDS = ("operational", "result")


@lru_cache(maxsize=1)
def key_kinds() -> dict[tuple[str, ...], str]:
    """Every entry of config/keys.yaml: its key path -> "operational" | "result"."""
    data = yaml.safe_load(KEYS.read_text(encoding="utf-8")) or {}
    out: dict[tuple[str, ...], str] = {}
    for kind in KINDS:
        for entry in data.get(kind) or {}:
            path = tuple(str(entry).split("."))
            if path in out:
                raise ValueError(f"{KEYS}: {entry} is listed twice")
            out[path] = kind
    return out


@lru_cache(maxsize=1)
def carried() -> dict[tuple[str, ...], tuple[str, ...]]:
    """Operational keys that rules also write into their outputs: key path -> the rules that pass it as a
    param of its own (config/keys.yaml's `carried`)."""
    data = yaml.safe_load(KEYS.read_text(encoding="utf-8")) or {}
    out = {tuple(str(k).split(".")): tuple(v) for k, v in (data.get("carried") or {}).items()}
    for path in out:
        if key_kinds().get(path) != "operational":
            raise ValueError(f"{KEYS}: carried key {'.'.join(path)} is not an operational entry")
    return out


def _covers(entry: tuple[str, ...], path: tuple[str, ...]) -> bool:
    return len(entry) <= len(path) and all(e in ("*", p) for e, p in zip(entry, path, strict=False))


def entry_for(path: tuple[str, ...]) -> tuple[str, ...] | None:
    """The longest entry of config/keys.yaml that covers `path` (None: no entry does)."""
    best = None
    for entry in key_kinds():
        if _covers(entry, path) and (best is None or len(entry) > len(best)):
            best = entry
    return best


def kind_of(path: tuple[str, ...] | str) -> str:
    """ "operational" or "result" for a config key path (an uncovered key counts as a result)."""
    path = tuple(path.split(".")) if isinstance(path, str) else tuple(path)
    entry = entry_for(path)
    return key_kinds()[entry] if entry is not None else "result"


def canonical(value: Any) -> Any:
    """Sorted mappings, lists as lists, an integral float as its int: one repr for one value."""
    if isinstance(value, Mapping):
        return {str(k): canonical(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _has_operational_below(path: tuple[str, ...]) -> bool:
    return any(
        kind == "operational" and len(entry) > len(path) and _covers(entry[: len(path)], path)
        for entry, kind in key_kinds().items()
    )


PROVIDERS = ("local", "docker", "e2b")  # sandbox.<provider>: read only when sandbox.provider names it


def result_values(value: Any, path: str) -> Any:
    """The parts of the config section at `path` that can change a result, canonical. Of the sandbox
    section only the active provider's settings count: the others are never read."""
    out = copy.deepcopy(_of_kind(value, path, "result"))
    if isinstance(out, dict):
        sandbox = out if path == "sandbox" else out.get("sandbox") if path == "" else None
        if isinstance(sandbox, dict):
            for name in PROVIDERS:
                if name != sandbox.get("provider"):
                    sandbox.pop(name, None)
    return canonical(out)


# Jobs read operational values from the config at run time, and `operational_values` is what their provenance
# records.
def operational_values(value: Any, path: str) -> Any:
    """The operational parts of the config section at `path` (None when it has none), canonical."""
    return canonical(_of_kind(value, path, "operational"))


_ABSENT = object()  # "no value of the wanted kind here" (a None value is a value)


def _split(value: Any, path: tuple[str, ...], want: str) -> Any:
    if isinstance(value, Mapping) and (_has_operational_below(path) or kind_of(path) == "operational"):
        out = {}
        for k, v in value.items():
            sub = _split(v, (*path, str(k)), want)
            if sub is not _ABSENT:
                out[k] = sub
        return out or _ABSENT
    return value if kind_of(path) == want else _ABSENT


def _of_kind(value: Any, path: str, want: str) -> Any:
    out = _split(value, tuple(path.split(".")) if path else (), want)
    return None if out is _ABSENT else out


def section(config: Mapping[str, Any], path: str) -> Any:
    """The config value at dotted `path` (KeyError naming the key when absent)."""
    node: Any = config
    for part in path.split(".") if path else ():
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(f"config has no {path}")
        node = node[part]
    return node


def schema_keys(sch: Mapping[str, Any], path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every leaf key path of the config schema (`*` for a per-name mapping's entries)."""
    props = sch.get("properties")
    if props:
        return [leaf for k, v in props.items() for leaf in schema_keys(v, (*path, k))]
    extra = sch.get("additionalProperties")
    if isinstance(extra, Mapping) and (extra.get("properties") or extra.get("additionalProperties")):
        return schema_keys(extra, (*path, "*"))
    return [path]


def schema_node(path: tuple[str, ...], sch: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """The schema of the config key at `path`."""
    if sch is None:
        from .config import schema

        sch = schema()
    node: Mapping[str, Any] = sch
    for part in path:
        props = node.get("properties") or {}
        node = props[part] if part in props else node["additionalProperties"]
    return node
