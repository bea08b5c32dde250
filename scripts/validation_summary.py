"""Snakemake entry point: the validation summary and the training JSONL without broken tasks."""

from sweflow.rulekit import from_snakemake
from sweflow.validation import summarize

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/validation_summary.py"):
    summarize(
        smk.input.jsonl,
        list(smk.input.results),
        smk.output.summary,
        smk.output.valid,
        dataset=smk.wildcards.dataset,
        split=smk.wildcards.split,
        reopen_errors=True,
    )
