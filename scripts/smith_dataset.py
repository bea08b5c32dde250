"""Snakemake entry point: the synthesized tasks with accepted statements as the dataset's split parquet."""

from sweflow.stages.smith import from_snakemake, smith_dataset_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/smith_dataset.py"):
    smith_dataset_step(
        list(smk.input.tasks), list(smk.input.statements), smk.output.parquet, smk.output.report
    )
