"""Snakemake entry point: the Hugging Face weights as a Megatron torch_dist checkpoint (GPU environment)."""

from sweflow.stages.train import from_snakemake, megatron_checkpoint_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/megatron_checkpoint.py"):
    p = smk.params
    megatron_checkpoint_step(
        smk.input.hf, smk.output.dist, smk.output.record, tp=p.tp, gpus=p.gpus, converter=p.converter
    )
