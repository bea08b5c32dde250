"""Evidence: every fresh evaluation's whole log and status map, kept as byte-stable gzip JSON lines."""

from __future__ import annotations

import gzip
import io
import json
import os
from typing import Any

from ..util import atomic_write


def evidence_record(res: Any, **labels: Any) -> dict[str, Any]:
    """One evaluation's evidence (``res``: an ``evaluate.EvalResult``): ``labels``, the outcome, the status
    map and the whole log."""
    return {
        **labels,
        "failure_reason": res.failure_reason,
        "resolved": res.resolved,
        "error": res.error,
        "exit_code": res.exit_code,
        "statuses": dict(sorted(res.statuses.items())),
        "canaries": list(res.canaries),
        "log": res.log,
    }


def write_evidence(path: str | os.PathLike, records: list[dict[str, Any]]) -> None:
    """Write evidence records as gzip-compressed JSON lines, byte-stable (mtime 0, no file name), atomically."""
    raw = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
        for rec in records:
            gz.write(json.dumps(rec, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogateescape"))
            gz.write(b"\n")
    atomic_write(path, raw.getvalue())


def read_evidence(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records written by ``write_evidence``."""
    with gzip.open(path, "rt", encoding="utf-8", errors="surrogateescape") as fh:
        return [json.loads(line) for line in fh if line.strip()]
