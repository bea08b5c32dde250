"""The workflow's stages: one module per `rules/<stage>.smk` file, with the same name.

`rules/<stage>.smk` declares the files, `scripts/<rule>.py` unpacks `snakemake.*` and calls the functions of
`sweflow.stages.<stage>` (and nothing else of sweflow), a stage function reads its inputs, calls the domain
packages and writes its outputs atomically. `common` holds what `rules/common.smk` and the Snakefile call.
"""

# Each stage module also hands its scripts `from_snakemake`, the logging/provenance wrapper of
# `sweflow.rulekit`. The domain packages a stage calls: `sweflow.dataset`, `sweflow.sandbox`,
# `sweflow.grading`, `sweflow.rollout`, ... Logic that does not know the workflow's files belongs in a domain
# package, not here.
