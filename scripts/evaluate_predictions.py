"""Snakemake entry point: every expert patch of one shard graded in a fresh sandbox."""

from sweflow.stages.sft import evaluate_predictions_step, from_snakemake

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/evaluate_predictions.py"):
    evaluate_predictions_step(
        smk.input.predictions,
        list(smk.input.jsonl),
        smk.output.evaluations,
        smk.output.evidence,
        provider=smk.params.provider,
        cfg=smk.config["sandbox"],
        parallel=smk.config["sft"]["evaluate"]["parallel"],  # operational: not a param
    )
