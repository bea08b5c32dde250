"""Snakemake entry point: aggregate per-image build records into the image -> template map."""

from sweflow.stages.data import from_snakemake, template_map

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/template_map.py"):
    template_map(
        list(smk.input.records),
        smk.output.map,
        smk.output.failures,
        prebuilt=smk.params.prebuilt,
        allow_empty=smk.config["allow_empty"],  # operational: not a param
        listing=f"results/{smk.wildcards.dataset}/images.txt",
    )
