"""Snakemake entry point: snapshot the model's config, tokenizer and weights at the resolved sha."""

from sweflow.stages.train import download_model_step, from_snakemake, model_endpoint

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/download_model.py"):
    p = smk.params
    download_model_step(
        smk.input.revision,
        smk.output.hf,
        smk.output.manifest,
        endpoint=model_endpoint(smk.config),  # the param is redacted
        allow_patterns=p.allow_patterns,
        attempts=smk.config["train"]["model"]["download_attempts"],  # operational: not params
        timeout=smk.config["train"]["model"]["timeout_sec"],
    )
