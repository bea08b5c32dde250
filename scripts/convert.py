"""Snakemake entry point: convert one split to the training JSONL."""

from sweflow.stages.data import convert, convert_options, from_snakemake, harness_from_config

smk = snakemake  # noqa: F821
with from_snakemake(smk, f"{smk.scriptdir}/convert.py"):
    p = smk.params
    harness = harness_from_config(p.harness["package"], p.harness["extra_repos"], p.harness["extra_parsers"])
    opts = convert_options(
        dataset=smk.wildcards.dataset,
        split=smk.wildcards.split,
        provider=p.provider,
        harness_cfg=p.harness,
        agent_cfg=p.agent,
        naming_cfg=p.naming,
        sandbox_timeout_sec=p.sandbox_timeout_sec,
        harness=harness,
    )
    convert(
        smk.input.parquet,
        smk.input.map,
        smk.input.failures,
        smk.output.jsonl,
        smk.output.report,
        opts=opts,
        harness=harness,
        shape=p.shape,
        limit=p.limit,
        max_problem_statement_chars=smk.params.max_problem_statement_chars,
        workers=smk.threads,
        allow_empty=smk.config["allow_empty"],  # operational: not a param
        listing=f"results/{smk.wildcards.dataset}/images.txt",
    )
