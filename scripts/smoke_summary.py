"""Snakemake entry point: one summary of every template's smoke marker."""

from sweflow.stages.sandbox import from_snakemake, smoke_summary

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/smoke_summary.py"):
    smoke_summary(list(smk.input.markers), smk.output.summary)
