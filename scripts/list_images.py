"""Snakemake entry point: one byte-stable record per task image, plus the ordered image list."""

from sweflow.stages.data import from_snakemake, list_images

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/list_images.py"):
    p = smk.params
    list_images(
        smk.output.images,
        smk.output.listing,
        parquets=dict(zip(p.splits, smk.input.parquets, strict=True)),
        naming=p.naming,
        shape=p.shape,
        limit=p.limit,
    )
