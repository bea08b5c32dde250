"""Snakemake entry point: expert attempts on one shard of a split's validated tasks (pass-through proxy)."""

from sweflow.stages.sft import SFT_COLLECT_CACHE, collect_trajectories_step, from_snakemake

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/collect_trajectories.py"):
    collect_trajectories_step(
        list(smk.input.jsonl),
        [(smk.wildcards.split, p) for p in smk.input.parquet],
        smk.output.predictions,
        shard=int(smk.wildcards.shard),
        collect=smk.config["sft"]["collect"],
        provider=smk.params.provider,
        cfg=smk.config["sandbox"],
        shape=smk.params.shape,
        cache_dir=SFT_COLLECT_CACHE,
    )
