"""Snakemake entry point: resolve the dataset revision to a commit sha."""

from sweflow.stages.data import from_snakemake, resolve_dataset

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/resolve_dataset.py") as ctx:
    p = smk.params
    rec = resolve_dataset(
        smk.output.revision,
        repo_id=p.repo_id,
        revision=p.revision,
        endpoint=smk.config["dataset"]["hub"]["endpoint"],  # params hold it redacted
        offline_dir=p.offline_dir,
        repo_type=p.repo_type,
        timeout=smk.config["dataset"]["hub"]["timeout_sec"],  # operational: not a param
    )
    ctx["dataset"] = {"repo_id": rec["repo_id"], "revision": rec["revision"], "sha": rec["sha"]}
