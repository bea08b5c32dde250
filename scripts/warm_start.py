"""Snakemake entry point: fine-tune the model on the e2e check's recorded sessions before GRPO."""

from sweflow.stages.train import from_snakemake, warm_start_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/warm_start.py"):
    p = smk.params
    warm_start_step(
        smk.input.hf,
        smk.input.trajectories,
        smk.output.model,
        smk.output.summary,
        steps=p.steps,
        lr=p.lr,
        seed=p.seed,
    )
