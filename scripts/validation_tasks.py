"""Snakemake entry point: one per-task validation input (JSONL row metadata + gold patch from the parquet)."""

from sweflow.stages.validate import from_snakemake, write_task_inputs

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/validation_tasks.py"):
    write_task_inputs(
        smk.input.jsonl,
        smk.input.parquet,
        smk.output.tasks,
        smk.output.listing,
        split=smk.wildcards.split,
        shape=smk.params.shape,
    )
