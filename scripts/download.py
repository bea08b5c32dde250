"""Snakemake entry point: download one split file at the resolved commit sha."""

from sweflow.stages.data import download_split, from_snakemake

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/download.py"):
    p = smk.params
    download_split(
        smk.output.parquet,
        revision_file=smk.input.revision,
        filename=p.filename,
        endpoint=smk.config["dataset"]["hub"]["endpoint"],  # the param is redacted
        offline_dir=p.offline_dir,
        attempts=smk.config["dataset"]["hub"]["download_attempts"],  # operational: not params
        timeout=smk.config["dataset"]["hub"]["timeout_sec"],
    )
