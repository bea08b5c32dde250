"""Snakemake entry point: smoke-test one template and write its marker."""

from sweflow.stages.sandbox import from_snakemake, smoke_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/smoke.py"):
    smoke_step(
        smk.input.record, smk.output.marker, provider=smk.wildcards.provider, cfg=smk.config["sandbox"]
    )
