"""Snakemake entry point: validate one task (gold must resolve, empty must not) in fresh sandboxes."""

from sweflow.rulekit import from_snakemake
from sweflow.validation import provider_from_config, validate_task_file

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/validate_task.py"):
    p = smk.params
    validate_task_file(
        smk.input.task,
        smk.output.result,
        provider=provider_from_config(p.provider, p.sandbox),
        repeats=p.validation["repeats"],
        parallel=smk.threads,
        evidence_out=smk.output.evidence,
        network_cfg=p.sandbox.get("network"),
        error_attempts=p.validation.get("error_attempts", 3),
        error_backoff=p.validation.get("error_backoff_sec", 5),
    )
