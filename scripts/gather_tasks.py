"""Snakemake entry point: kept candidates -> task rows, the task repository and the yield summary."""

from sweflow.stages.smith import from_snakemake, gather_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/gather_tasks.py"):
    gather_step(
        smk.input.env,
        smk.input.bare,
        list(smk.input.reports),
        list(smk.input.candidates),
        smk.output.tasks,
        smk.output.git,
        smk.output.summary,
    )
