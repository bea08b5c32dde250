"""Snakemake entry point: validate one task (gold must resolve, empty must not) in fresh sandboxes."""

from sweflow.stages.validate import from_snakemake, validate_task_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/validate_task.py"):
    validate_task_step(
        smk.input.task,
        smk.output.result,
        provider=smk.params.provider,
        cfg=smk.config["sandbox"],  # params hold only the result values of these sections
        validation=smk.config["validation"],
        parallel=smk.threads,
        evidence_out=smk.output.evidence,
    )
