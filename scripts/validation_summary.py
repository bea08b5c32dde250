"""Snakemake entry point: the validation summary and the training JSONL without broken tasks."""

from sweflow.stages.validate import from_snakemake, summarize

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
        allow_unguarded=smk.params.allow_unguarded,
        allow_empty=smk.config["allow_empty"],  # operational: not a param
    )
