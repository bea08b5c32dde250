"""Load the workflow config outside Snakemake (for the CLI): merged YAML files, validated, defaults filled."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "config" / "config.yaml"
SCHEMA = ROOT / "config" / "schema.yaml"


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _fill_defaults(schema: dict[str, Any], data: Any) -> Any:
    if schema.get("type") == "object" or "properties" in schema:
        if not isinstance(data, dict):
            return data
        for name, sub in schema.get("properties", {}).items():
            if name not in data and "default" in sub:
                data[name] = _copy(sub["default"])
            if name in data:
                data[name] = _fill_defaults(sub, data[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name in data:
                if name not in schema.get("properties", {}):
                    data[name] = _fill_defaults(extra, data[name])
    return data


def _copy(v: Any) -> Any:
    import copy

    return copy.deepcopy(v)


def load_config(*paths: str | os.PathLike, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The embedded default, then each file in order, then overrides; validated against the schema."""
    import jsonschema

    cfg: dict[str, Any] = {}
    for p in (DEFAULT_CONFIG, *paths):
        try:
            data = yaml.safe_load(Path(p).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config: {exc}".splitlines()[0], file=str(p)) from None
        cfg = deep_merge(cfg, data)
    if overrides:
        cfg = deep_merge(cfg, overrides)
    schema = yaml.safe_load(SCHEMA.read_text())
    cfg = _fill_defaults(schema, cfg)
    try:
        jsonschema.validate(cfg, schema)
    except jsonschema.ValidationError as exc:
        where = ".".join(str(x) for x in exc.absolute_path) or "(top)"
        raise ConfigError(exc.message, field=where) from None
    return cfg
