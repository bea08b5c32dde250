"""The workflow's stages: one module per `rules/<stage>.smk` file, with the same name.

`rules/<stage>.smk` declares the files, `scripts/<rule>.py` unpacks `snakemake.*` and calls the functions of
`sweflow.stages.<stage>` (and nothing else of sweflow: each stage module also hands its scripts
`from_snakemake`, the logging/provenance wrapper of `sweflow.rulekit`), and a stage function reads its inputs,
calls the domain packages (`sweflow.dataset`, `sweflow.sandbox`, `sweflow.grading`, `sweflow.rollout`, ...)
and writes its outputs atomically. `common` holds what `rules/common.smk` and the Snakefile call. Logic that
does not know the workflow's files belongs in a domain package, not here.
"""
