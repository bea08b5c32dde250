"""Snakemake entry point: one summary of every template's smoke marker."""

from sweflow.rulekit import from_snakemake
from sweflow.stages_sandbox import smoke_summary

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/smoke_summary.py"):
    smoke_summary(list(smk.input.markers), smk.output.summary)
