"""Report stage: the run's HTML report (`sweflow.report`), written by the last rule of the pipeline and by
`sweflow report` for any workflow folder."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..progress import Progress
from ..rulekit import from_snakemake

__all__ = ["from_snakemake", "report_paths", "report_step"]

log = logging.getLogger("sweflow.report")

# kinds whose files name a run or profile: only the configured ones (the rule's inputs) are reported
RUN_KINDS = ("grpo", "sft_train", "smith", "e2e")


def report_paths(
    root: str | os.PathLike, *, dataset: str, splits: Iterable[str], targets: Iterable[str] | None = None
) -> dict[str, list[str]]:
    """The artifacts of `dataset` under `root`, by kind; with `targets` (the pipeline's end products),
    runs, profiles and checks only where a target names them, so an older run's folder is not shown."""
    from ..report import find_artifacts

    paths = find_artifacts(root, dataset=dataset, splits=list(splits))
    if targets is not None:
        wanted = {os.path.normpath(t) for t in targets}
        for kind in RUN_KINDS:
            paths[kind] = [p for p in paths[kind] if os.path.normpath(p) in wanted]
    return paths


def report_step(
    out: str | os.PathLike,
    *,
    dataset: str,
    splits: Iterable[str],
    targets: Iterable[str] | None = None,
    root: str | os.PathLike = ".",
    title: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write the report of `dataset` to `out`; one log line (or bar step) per section read."""
    from ..report import SECTION_READERS, write_report

    paths = report_paths(root, dataset=dataset, splits=splits, targets=targets)
    log.info("report of %s: %d artifacts", dataset, sum(len(v) for v in paths.values()))
    prog = progress or Progress(len(SECTION_READERS), "report", logger=log, bar=False)
    with prog:
        data = write_report(
            paths,
            out,
            root=root,
            title=title or f"sweflow report: {dataset}",
            on_section=lambda name: prog.update(item=name),
        )
    log.info("report written to %s (%d bytes)", out, Path(out).stat().st_size)
    return data
