"""Snakemake entry point: a predictions file made elsewhere graded on the held-out split (SWE-bench's report)."""

from sweflow.stages.evaluate import from_snakemake, grade_predictions_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/grade_predictions.py"):
    grade_predictions_step(
        smk.input.predictions,
        smk.input.tasks,
        dict(smk.output.items()),
        sandbox=smk.config["sandbox"],
        provider=smk.params.provider,
    )
