"""Snakemake entry point: supervised fine-tuning of the model on the messages (TRL SFTTrainer)."""

from sweflow.stages.sft import from_snakemake, train_sft_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/train_sft.py"):
    train_sft_step(
        smk.input.messages,
        smk.input.model,
        f"results/{smk.wildcards.dataset}/sft/train/{smk.wildcards.run}/work",
        smk.output.summary,
        smk.output.metrics,
        smk.output.final,
        train=smk.config["sft"]["train"],  # params hold only its result values
        tracking=smk.config.get("train", {}).get("tracking"),  # operational: TensorBoard / W&B
    )
