"""SWE-bench's formats both ways: predictions files (read and written) and the harness's run report.

`read_predictions` takes a predictions file made anywhere (JSONL, a JSON list, or the harness's
{instance_id: prediction} object); `run_report` gives the harness's `make_run_report` fields for graded
outcomes; `instance_report` the per-instance `report.json` its evaluation writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import DatasetError

INSTANCE_ID, MODEL, PATCH = "instance_id", "model_name_or_path", "model_patch"
RESOLVED, UNRESOLVED, ERROR, EMPTY = "resolved", "unresolved", "error", "empty_patch"


def prediction(instance_id: str, model: str, patch: str) -> dict[str, str]:
    """One line of a predictions file."""
    return {INSTANCE_ID: instance_id, MODEL: model, PATCH: patch}


def read_predictions(path: str | Path) -> list[dict[str, Any]]:
    """The predictions of a file in any of the harness's shapes; a bad one raises naming the file, row and
    field. One instance predicted twice is refused (the harness keys them by instance)."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    stripped = text.lstrip()
    items: list[Any]
    if stripped.startswith(("[", "{")) and not _is_jsonl(stripped):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise DatasetError(f"not JSON: {exc}", file=str(p)) from None
        items = list(data.values()) if isinstance(data, dict) else list(data)
    else:
        items = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except ValueError as exc:
                    raise DatasetError(f"not JSON: {exc}", file=str(p), row=str(n)) from None
    out, seen = [], set()
    for n, item in enumerate(items, 1):
        if not isinstance(item, dict):
            raise DatasetError("a prediction is not an object", file=str(p), row=str(n))
        for key in (INSTANCE_ID, PATCH):
            if key not in item:
                raise DatasetError(f"no {key}", file=str(p), row=str(n), field=key)
        iid = item[INSTANCE_ID]
        if not isinstance(iid, str) or not iid:
            raise DatasetError("not a non-empty string", file=str(p), row=str(n), field=INSTANCE_ID)
        if item[PATCH] is not None and not isinstance(item[PATCH], str):
            raise DatasetError("not a string or null", file=str(p), row=str(n), field=PATCH)
        if iid in seen:
            raise DatasetError(f"{iid} is predicted twice", file=str(p), row=str(n), field=INSTANCE_ID)
        seen.add(iid)
        out.append({INSTANCE_ID: iid, MODEL: str(item.get(MODEL) or p.stem), PATCH: item[PATCH]})
    return out


def _is_jsonl(text: str) -> bool:
    first = text.split("\n", 1)[0].strip()
    try:
        return isinstance(json.loads(first), dict) and "\n" in text.strip()
    except ValueError:
        return False


def outcome(patch: str | None, graded: Mapping[str, Any] | None) -> str:
    """How the harness counts one prediction: empty_patch (nothing to apply), error (no grade: the
    evaluation's infrastructure failed), resolved or unresolved (a failed apply and a refused patch too)."""
    if not patch:
        return EMPTY
    if graded is None or graded.get("infra"):
        return ERROR
    return RESOLVED if graded.get("resolved") else UNRESOLVED


def instance_report(instance_id: str, patch: str | None, graded: Mapping[str, Any] | None) -> dict[str, Any]:
    """The per-instance report.json of the harness's evaluation (its `get_eval_report` fields)."""
    applied = (
        bool(graded) and not graded.get("infra") and graded.get("failure_reason") != "failed_apply_patch"
    )
    return {
        instance_id: {
            "patch_is_None": patch is None,
            "patch_exists": patch is not None,
            "patch_successfully_applied": bool(patch) and applied,
            "resolved": outcome(patch, graded) == RESOLVED,
        }
    }


def run_report(dataset_ids: Iterable[str], predictions: Sequence[Mapping[str, Any]],
               outcomes: Mapping[str, str]) -> dict[str, Any]:  # fmt: skip
    """The harness's run report (`make_run_report`, schema 2, without its Docker fields) for `outcomes`
    (instance_id -> `outcome`) of `predictions` on the tasks `dataset_ids`."""
    ids = list(dict.fromkeys(dataset_ids))
    predicted = {p[INSTANCE_ID] for p in predictions}
    got = {i: outcomes.get(i, ERROR) for i in ids if i in predicted}
    pick = {
        kind: sorted(i for i, o in got.items() if o == kind) for kind in (RESOLVED, UNRESOLVED, ERROR, EMPTY)
    }
    completed = sorted(pick[RESOLVED] + pick[UNRESOLVED])
    return {
        "total_instances": len(ids),
        "submitted_instances": len(predicted),
        "completed_instances": len(completed),
        "resolved_instances": len(pick[RESOLVED]),
        "unresolved_instances": len(pick[UNRESOLVED]),
        "empty_patch_instances": len(pick[EMPTY]),
        "error_instances": len(pick[ERROR]),
        "completed_ids": completed,
        "incomplete_ids": sorted(i for i in ids if i not in predicted),
        "empty_patch_ids": pick[EMPTY],
        "submitted_ids": sorted(predicted),
        "resolved_ids": pick[RESOLVED],
        "unresolved_ids": pick[UNRESOLVED],
        "error_ids": pick[ERROR],
        "schema_version": 2,
    }
