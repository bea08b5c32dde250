"""Publish stage: push a trained checkpoint to a Hub repository with its model card (`publish_step`); asked
for by target only (results/<dataset>/publish/<checkpoint>.json), never part of `all`."""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..models.card import model_card, push_model
from ..rulekit import from_snakemake
from ..util import atomic_write_json, read_json, redact, sha256_bytes, sha256_file
from .data import hub_endpoint

log = logging.getLogger("sweflow.stages")

__all__ = ["from_snakemake", "publish_step"]


def publish_step(
    model_dir: str | os.PathLike,
    evaluations: Sequence[str | os.PathLike],
    revision: str | os.PathLike,
    out: str | os.PathLike,
    manifest_out: str | os.PathLike,
    *,
    checkpoint: str,
    publish: Mapping[str, Any],
    recipe: Mapping[str, Any],
    base_model: str | None,
) -> dict[str, Any]:
    """Write the run's provenance manifest (`manifest_out`), build the card (recipe, dataset sha, evaluation
    table, manifest hash; `recipe`: the result keys of the section that trained it, credentials redacted) and
    push the checkpoint with it; `out` records the repo, commit and hashes. The
    endpoint "local" is the bundled Hub, written with a token made for this push; another endpoint takes the
    token from the variable `publish.token_env`."""
    from ..provenance import write_manifest

    repo_id = publish.get("repo_id")
    if not repo_id:
        raise ConfigError("no repository to publish to", field="publish.repo_id",
                          hint="set publish.repo_id (e.g. --config publish.repo_id=me/my-model)")  # fmt: skip
    dataset = read_json(revision)
    evals = []
    for p in evaluations:
        e = read_json(p)
        evals.append({**e, "split": Path(p).parent.parent.name})
    write_manifest(manifest_out, root=".")
    manifest_sha = sha256_file(manifest_out)
    card = model_card(repo_id=repo_id, checkpoint=checkpoint, base_model=base_model, dataset=dataset,
                      recipe=dict(recipe), evaluations=evals, manifest_sha256=manifest_sha)  # fmt: skip
    endpoint = publish.get("endpoint")
    local = endpoint == "local"
    token = secrets.token_urlsafe(24) if local else os.environ.get(str(publish.get("token_env") or ""))
    if not local and not token:
        raise ConfigError(f"no write token in ${publish.get('token_env')}", field="publish.token_env",
                          hint="export a Hub token with write access under that name")  # fmt: skip
    with hub_endpoint(endpoint, write_token=token if local else None) as url:
        sha = push_model(model_dir, card, repo_id=repo_id, endpoint=url, token=token,
                         private=bool(publish["private"]),
                         message=f"sweflow: {checkpoint} of {dataset.get('repo_id')}@{dataset.get('sha')}")  # fmt: skip
    record = {
        "repo_id": repo_id,
        "endpoint": "local-hub" if local else (redact(endpoint) if endpoint else "huggingface.co"),
        "checkpoint": checkpoint,
        "commit": sha,
        "card_sha256": sha256_bytes(card.encode("utf-8")),
        "manifest_sha256": manifest_sha,
        "dataset_sha": dataset.get("sha"),
        "evaluations": [{k: e.get(k) for k in ("checkpoint", "split", "pass@1")} for e in evals],
    }
    atomic_write_json(out, record)
    log.info(
        "published %s to %s at %s (card %s)", checkpoint, repo_id, sha, json.dumps(record["evaluations"])
    )
    return record
