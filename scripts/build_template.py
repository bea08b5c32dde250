"""Snakemake entry point: build (or reuse) the sandbox template of one task image."""

from sweflow.stages.sandbox import build_template_step, from_snakemake

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/build_template.py"):
    build_template_step(
        smk.input.image,
        smk.output.record,
        provider=smk.wildcards.provider,
        cfg=smk.config["sandbox"],  # params hold only its result values
        claude_record=smk.input.get("claude"),
        wheel_record=smk.input.get("wheel"),
        task_repos=smk.params.task_repos,
    )
