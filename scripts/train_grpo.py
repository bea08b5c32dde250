"""Snakemake entry point: synchronous GRPO on the split's validated tasks with the configured engine."""

from sweflow.stages.train import from_snakemake, train_grpo_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/train_grpo.py"):
    train_grpo_step(
        smk.input.tasks,
        smk.input.model,
        smk.input.template_map,
        {k: smk.output[k] for k in ("summary", "metrics", "rollouts", "final")},
        train=smk.config["train"],  # params hold it redacted
        sandbox=smk.config["sandbox"],
        provider=smk.params.provider,
        megatron_dir=smk.input.megatron[0] if smk.input.megatron else None,
        attempt=int(smk.resources.attempt),
        validation=smk.input.validation,
    )
