"""The e2e stage (rules/e2e.smk) as plain functions: find the sample task's training row, run the end-to-end
check of `sweflow.rollout.e2e` (the real agent behind the proxy, two scripted policies, fresh evaluation),
write the report and the grading evidence.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import DatasetError, EvalError
from ..rollout.e2e import e2e_check
from ..rulekit import from_snakemake
from ..sandbox.base import Provider
from ..sandbox.registry import provider_from_config
from ..sandbox.settings import NetworkSettings, SandboxSettings
from ..util import atomic_write_json

__all__ = ["e2e_check_step", "e2e_stage", "find_row", "from_snakemake", "load_tokenizer"]

log = logging.getLogger("sweflow.e2e")


def find_row(jsonl_files: Sequence[str | os.PathLike], instance_id: str | None) -> dict[str, Any]:
    """The training row of `instance_id` (None: the first row of the first file) from converted JSONL files."""
    for path in jsonl_files:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                row = json.loads(line)
                if instance_id is None or row.get("metadata", {}).get("instance_id") == instance_id:
                    return row
    raise DatasetError(
        f"no training row for {instance_id or 'any instance'}",
        file=", ".join(str(p) for p in jsonl_files),
        field="instance_id",
    )


def load_tokenizer(path: str | os.PathLike | None) -> Any:
    """The tokenizer behind the scripted policy: the configured one, else the tiny local one (built here,
    no download) whose chat template speaks the Qwen3-coder tool-call format."""
    from transformers import AutoTokenizer

    from ..offline.tiny_model import tiny_tokenizer_path

    return AutoTokenizer.from_pretrained(str(path or tiny_tokenizer_path()))


def e2e_stage(
    jsonl_files: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    instance_id: str,
    provider: Provider,
    tokenizer: Any,
    strict: bool = True,
    evidence_out: str | os.PathLike | None = None,
    network: NetworkSettings | None = None,
    trajectories_out: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """The rule's body: find the row, run both policies, write the report; EvalError when a check failed.

    With `strict`, a failed check raises (after logging the full report) and nothing is written.
    `evidence_out`: every grading's whole log and status map, gzip JSON lines (one per policy);
    `trajectories_out`: each policy's recorded token samples and outcome, gzip JSON lines.
    """
    row = find_row(jsonl_files, instance_id)
    evidence: list[dict[str, Any]] = []
    trajectories: list[dict[str, Any]] = []
    report = e2e_check(
        row,
        provider=provider,
        tokenizer=tokenizer,
        evidence=evidence,
        network=network,
        trajectories=trajectories,
    )
    if strict and not report["ok"]:
        log.error("e2e report: %s", json.dumps(report, sort_keys=True))
        bad = [f"{k}: {v['status']} reward={v['reward']} reason={v['failure_reason']} error={v['error']}"
               for k, v in report["policies"].items() if not v["ok"]]  # fmt: skip
        raise EvalError("end-to-end check failed: " + "; ".join(bad), file=str(out), row=instance_id)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    if evidence_out is not None:
        from ..grading.evaluate import write_evidence

        write_evidence(evidence_out, evidence)
    if trajectories_out is not None:
        from ..grading.evaluate import write_evidence

        write_evidence(trajectories_out, trajectories)
    atomic_write_json(out, report)
    return report


def e2e_check_step(
    jsonl_files: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    instance_id: str,
    provider: str,
    cfg: Mapping[str, Any],
    tokenizer: str | os.PathLike | None = None,
    evidence_out: str | os.PathLike | None = None,
    trajectories_out: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """``e2e_stage`` with the agent sandboxes' provider made from the ``sandbox`` config section ``cfg`` and
    the tokenizer loaded from its path (None: the tiny local one)."""
    settings = SandboxSettings.from_config(cfg)
    return e2e_stage(
        jsonl_files,
        out,
        instance_id=instance_id,
        provider=provider_from_config(provider, settings),
        tokenizer=load_tokenizer(tokenizer),
        evidence_out=evidence_out,
        network=settings.network,
        trajectories_out=trajectories_out,
    )
