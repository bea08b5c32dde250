"""Snakemake entry point: one checkpoint's resolve rate on the held-out split (pass@1, pass@k, SWE-bench files)."""

from sweflow.stages.evaluate import evaluate_checkpoint_step, from_snakemake

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/evaluate_checkpoint.py"):
    evaluate_checkpoint_step(
        smk.input.model,
        smk.input.tasks,
        dict(smk.output.items()),
        checkpoint=smk.wildcards.checkpoint,
        evaluate=smk.config["evaluate"],  # params hold only its result values (parallel is operational)
        train=smk.config["train"],
        sandbox=smk.config["sandbox"],
        provider=smk.params.provider,
    )
