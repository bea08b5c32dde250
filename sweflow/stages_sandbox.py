"""The sandbox stage as plain functions: build one template, smoke-test it, summarise the markers."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from .util import atomic_write_json, read_json

log = logging.getLogger("sweflow.stages")


def build_template_step(
    image_file: str | os.PathLike, out: str | os.PathLike, *, provider: str, cfg: Mapping[str, Any]
) -> dict:
    """Write the per-image template record (provisional: the template is the image itself)."""
    rec = read_json(image_file)
    data = {"image": rec["image"], "provider": provider, "template": rec["image"], "ok": True}
    atomic_write_json(out, data)
    return data


def smoke_step(
    record_file: str | os.PathLike, out: str | os.PathLike, *, provider: str, cfg: Mapping[str, Any]
) -> dict:
    rec = read_json(record_file)
    data = {
        "template": rec.get("template"),
        "image": rec["image"],
        "provider": provider,
        "ok": False,
        "error": "smoke not implemented yet",
    }
    atomic_write_json(out, data)
    return data


def smoke_summary(markers: list[str], out: str | os.PathLike) -> dict:
    items = [read_json(m) for m in markers]
    data = {
        "templates": len(items),
        "ok": sum(1 for i in items if i.get("ok")),
        "failed": sorted(
            ({"image": i.get("image"), "error": i.get("error")} for i in items if not i.get("ok")),
            key=lambda d: d["image"] or "",
        ),
    }
    atomic_write_json(out, data)
    return data
