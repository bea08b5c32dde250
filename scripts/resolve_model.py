"""Snakemake entry point: resolve the model revision to a commit sha."""

from sweflow.stages.train import from_snakemake, model_endpoint, resolve_model_step

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/resolve_model.py"):
    p = smk.params
    resolve_model_step(
        smk.output.revision,
        repo_id=p.repo_id,
        revision=p.revision,
        endpoint=model_endpoint(smk.config),  # params hold it redacted
        timeout=smk.config["train"]["model"]["timeout_sec"],  # operational: not a param
    )
