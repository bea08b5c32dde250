"""Snakemake entry point: fetch the pinned Claude Code binary once for every template."""

from sweflow.stages.sandbox import claude_code_artifact, from_snakemake

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/claude_code.py"):
    claude_code_artifact(smk.output.record, version=smk.wildcards.version)
