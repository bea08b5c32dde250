"""Snakemake entry point: build the sweflow wheel for the isolated in-sandbox runtime."""

from sweflow.stages.sandbox import from_snakemake, runtime_wheel

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/runtime_wheel.py"):
    runtime_wheel(smk.output.record)
