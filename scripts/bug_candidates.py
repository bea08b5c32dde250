"""Snakemake entry point: one shard of one strategy's bug candidates."""

from sweflow.stages.smith import bug_candidates_step, from_snakemake

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/bug_candidates.py"):
    bug_candidates_step(
        smk.wildcards.strategy,
        int(smk.wildcards.shard),
        smk.input.env,
        smk.input.bare,
        smk.output.candidates,
        smk.output.report,
        smith=smk.config["smith"],  # the real section: params hold it with credentials redacted
        validated=smk.input.get("validated", []),
        validated_candidates=smk.input.get("validated_candidates", []),
    )
