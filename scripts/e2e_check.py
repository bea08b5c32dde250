"""Snakemake entry point: the end-to-end check of one sample task (real agent, two scripted policies)."""

from sweflow.e2e import e2e_stage, load_tokenizer
from sweflow.rulekit import from_snakemake
from sweflow.stages_sandbox import provider_from_config

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/e2e_check.py"):
    e2e_stage(
        list(smk.input.jsonl),
        smk.output.report,
        instance_id=smk.wildcards.instance_id,
        provider=provider_from_config(smk.params.provider, smk.params.sandbox),
        tokenizer=load_tokenizer(smk.params.tokenizer),
        evidence_out=smk.output.evidence,
        network=smk.params.sandbox.get("network"),
    )
