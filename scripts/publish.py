"""Snakemake entry point: push a trained checkpoint with its model card to the configured Hub repository."""

from sweflow.stages.publish import from_snakemake, publish_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/publish.py"):
    publish_step(
        smk.input.model,
        list(smk.input.evaluations),
        smk.input.revision,
        smk.output.record,
        smk.output.manifest,
        checkpoint=smk.wildcards.checkpoint,
        publish=smk.config["publish"],  # token_env is operational
        recipe=smk.params.recipe,
        base_model=smk.params.base_model,
    )
