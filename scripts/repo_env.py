"""Snakemake entry point: a repository profile's bare repository, environment template and reference run."""

from sweflow.stages.smith import from_snakemake, load_profile, repo_env_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/repo_env.py"):
    repo_env_step(
        load_profile(smk.params.profile),
        smk.output.bare,
        smk.output.env,
        provider=smk.params.provider,
        sandbox_cfg=smk.config["sandbox"],  # params hold only its result values
        runs=smk.params.runs,
        harness_package=smk.params.harness,
        wheel_record=smk.input.wheel,
    )
