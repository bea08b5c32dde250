"""Snakemake entry point: the kept trajectories as chat JSONL (tool-call form and SWE-smith's text form)."""

from sweflow.stages.sft import from_snakemake, traj_to_messages_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/traj_to_messages.py"):
    traj_to_messages_step(
        list(smk.input.predictions),
        list(smk.input.evaluations),
        smk.output.tools,
        smk.output.text,
        smk.output.summary,
        extra=smk.params.extra,
    )
