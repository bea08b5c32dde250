"""Snakemake entry point: problem statements for one shard of the synthesized tasks."""

from sweflow.stages.smith import from_snakemake, statements_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/problem_statements.py"):
    statements_step(
        list(smk.input.tasks),
        int(smk.wildcards.shard),
        smk.params.shards,
        smk.output.statements,
        lm=smk.config["smith"]["lm"],  # the real section: params hold it with credentials redacted
        attempts=smk.params.attempts,
    )
