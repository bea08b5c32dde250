"""Snakemake entry point: download one split file at the resolved commit sha."""

from sweflow.rulekit import from_snakemake
from sweflow.stages import download_split

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/download.py"):
    p = smk.params
    download_split(
        smk.output.parquet,
        revision_file=smk.input.revision,
        filename=p.filename,
        endpoint=smk.config["dataset"]["hub"]["endpoint"],  # the param is redacted
        offline_dir=p.offline_dir,
        attempts=p.attempts,
        timeout=p.timeout,
    )
