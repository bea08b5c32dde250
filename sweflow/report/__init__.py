"""The run report: one self-contained HTML page with plots, built from the pipeline's artifacts.

`find_artifacts` lists what a workflow folder holds, `collect` reads it, `render` writes the page
(`sweflow report` and the `report` rule both end in `write_report`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from ..util import atomic_write
from .collect import PATTERNS, SECTION_READERS, ReportError, collect, find_artifacts
from .html import SECTIONS, render

__all__ = [
    "PATTERNS",
    "SECTIONS",
    "SECTION_READERS",
    "ReportError",
    "collect",
    "find_artifacts",
    "render",
    "write_report",
]


def write_report(
    paths: Mapping[str, list[str]],
    out: str | os.PathLike,
    *,
    root: str | os.PathLike = ".",
    title: str = "sweflow report",
    on_section: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Read the artifacts in `paths` (by kind, relative to `root`), write the page to `out` (temp file +
    rename) and return the collected data. `on_section(name)` is called as each section is drawn."""
    data = collect(paths, root)
    ds = data["provenance"]["dataset"]
    subtitle = f"dataset {ds.get('repo_id')} @ {ds.get('revision')} ({ds.get('sha')})" if ds else ""
    atomic_write(out, render(data, title=title, subtitle=subtitle, on_section=on_section))
    return data
