"""Snakemake entry point: the end-to-end check of one sample task (real agent, two scripted policies)."""

from sweflow.stages.e2e import e2e_check_step, from_snakemake

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/e2e_check.py"):
    e2e_check_step(
        list(smk.input.jsonl),
        smk.output.report,
        instance_id=smk.wildcards.instance_id,
        provider=smk.params.provider,
        cfg=smk.config["sandbox"],  # params hold only its result values
        tokenizer=smk.params.tokenizer,
        evidence_out=smk.output.evidence,
        trajectories_out=smk.output.trajectories,
    )
