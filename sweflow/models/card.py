"""A published checkpoint's model card (`model_card`) and its push to a Hub repository (`push_model`).

The card carries what a reader needs to trust the weights: the training recipe, the dataset and the commit it
was read at, the held-out evaluation table, and the hash of the provenance manifest that lists every artifact.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml


def _eval_rows(evaluations: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = [
        "| checkpoint | split | pass@1 | 95% interval | pass@k | tasks | attempts |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in evaluations:
        k = e.get("k")
        lo, hi = e.get("pass@1_interval") or (0.0, 0.0)
        rows.append(f"| {e.get('checkpoint')} | {e.get('split')} | {e.get('pass@1', 0.0):.3f} | [{lo:.3f}, {hi:.3f}] "
                    f"| pass@{k} {e.get(f'pass@{k}', 0.0):.3f} | {e.get('tasks')} | {e.get('attempts')} |")  # fmt: skip
    return rows


def model_card(
    *,
    repo_id: str,
    checkpoint: str,
    base_model: str | None,
    dataset: Mapping[str, Any],
    recipe: Mapping[str, Any],
    evaluations: Sequence[Mapping[str, Any]],
    manifest_sha256: str,
) -> str:
    """README.md: YAML metadata (base model, dataset, tags, the evaluation figures as model-index results)
    and the recipe, dataset revision, evaluation table and provenance hash."""
    meta: dict[str, Any] = {"library_name": "transformers", "tags": ["sweflow", "swe-agent", checkpoint],
                            "datasets": [dataset.get("repo_id")]}  # fmt: skip
    if base_model:
        meta["base_model"] = base_model
    if evaluations:
        meta["model-index"] = [{"name": repo_id, "results": [
            {"task": {"type": "text-generation", "name": "software engineering"},
             "dataset": {"type": dataset.get("repo_id"), "name": f"{dataset.get('repo_id')} ({e.get('split')})",
                         "revision": dataset.get("sha")},
             "metrics": [{"type": "pass@1", "value": round(float(e.get("pass@1", 0.0)), 4),
                          "name": f"pass@1 ({e.get('checkpoint')})"}]}
            for e in evaluations
        ]}]  # fmt: skip
    lines = [
        "---",
        yaml.safe_dump(meta, sort_keys=True).rstrip("\n"),
        "---",
        f"# {repo_id}",
        "",
        f"The `{checkpoint}` checkpoint of a sweflow run: a coding agent trained on software",
        "engineering tasks with rewards graded in fresh sandboxes.",
        "",
        "## Data",
        "",
        f"- dataset: `{dataset.get('repo_id')}`, revision `{dataset.get('revision')}`",
        f"- dataset commit sha: `{dataset.get('sha')}`",
        "",
        "## Held-out evaluation",
        "",
        *(_eval_rows(evaluations) if evaluations else ["No checkpoint was evaluated."]),
        "",
        "## Training recipe",
        "",
        "```json",
        json.dumps(recipe, indent=2, sort_keys=True),
        "```",
        "",
        "## Provenance",
        "",
        f"- provenance manifest sha256: `{manifest_sha256}` (every artifact of the run and the record that made it)",
        "",
    ]
    return "\n".join(lines)


def push_model(
    model_dir: str | os.PathLike,
    card: str,
    *,
    repo_id: str,
    endpoint: str | None,
    token: str | None,
    private: bool,
    message: str,
) -> str:
    """Create `repo_id` if needed and commit the model folder's files with `card` as its README.md in one
    commit; return the commit sha."""
    import tempfile

    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(endpoint=endpoint, token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    root = Path(model_dir)
    files = sorted(
        p for p in root.rglob("*") if p.is_file() and not p.relative_to(root).parts[0].startswith(".")
    )
    with tempfile.TemporaryDirectory(prefix="sweflow-card-") as tmp:
        readme = Path(tmp) / "README.md"
        readme.write_text(card, encoding="utf-8")
        ops = [
            CommitOperationAdd(p.relative_to(root).as_posix(), str(p)) for p in files if p.name != "README.md"
        ]
        ops.append(CommitOperationAdd("README.md", str(readme)))
        info = api.create_commit(repo_id, ops, commit_message=message)
    return str(info.oid)
