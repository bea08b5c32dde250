"""Snakemake entry point: one byte-stable row file per validated task (per-item inputs downstream)."""

from sweflow.stages.validate import from_snakemake, write_valid_rows

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/valid_rows.py"):
    write_valid_rows(smk.input.valid, smk.output.rows, smk.output.listing)
