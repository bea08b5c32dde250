"""Snakemake entry point: validate a whole split."""

from sweflow.stages.data import from_snakemake, validate_split

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/validate_split.py"):
    validate_split(
        smk.input.parquet,
        smk.output.report,
        split=smk.wildcards.split,
        expected_rows=smk.params.expected_rows,
        shape=smk.params.shape,
        max_problem_statement_chars=smk.params.max_problem_statement_chars,
    )
