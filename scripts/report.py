"""Snakemake entry point: the run's HTML report, after every other target."""

from sweflow.stages.report import from_snakemake, report_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/report.py"):
    report_step(
        smk.output.html,
        dataset=smk.wildcards.dataset,
        splits=smk.params.splits,
        targets=list(smk.input),
    )
