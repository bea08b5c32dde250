"""Snakemake entry point: validate one shard of candidates (reference vs bug, k runs each)."""

from sweflow.stages.smith import from_snakemake, validate_candidates_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/validate_candidates.py"):
    validate_candidates_step(
        smk.input.candidates,
        smk.input.env,
        smk.output.reports,
        provider=smk.params.provider,
        sandbox_cfg=smk.config["sandbox"],  # params hold only the result values of these sections
        validation=smk.config["smith"]["validation"],
        harness_package=smk.params.harness,
        require_p2p=smk.params.require_p2p,
        parallel=smk.threads,
    )
