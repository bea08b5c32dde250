# SWE-smith branch: repository profile -> environment + reference run -> bug candidates (one job per strategy
# and shard) -> before/after validation (per shard, k runs) -> gather (task rows; bugged states as commits of
# a local bare repository) -> problem statements (per shard) -> resources/datasets/<smith dataset>/train.parquet,
# which the data stage reads like any split (list_images -> convert -> validate_tasks).


wildcard_constraints:
    profile=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    strategy="|".join(SMITH_ALL) or "(?!)",
    shard=r"\d+",


rule repo_env:
    input:
        wheel="resources/sandbox/runtime/wheel.json",
    output:
        env="results/smith/{profile}/env.json",
        bare=directory("results/smith/{profile}/repo.git"),
    log:
        "logs/smith/{profile}/repo_env.log",
    conda:
        "../envs/smith.yaml"
    params:
        profile=lambda wildcards: canonical(SMITH_PROFILES[wildcards.profile].to_dict()),
        provider=PROVIDER,
        sandbox=result_params("sandbox"),
        runs=SMITH["validation"]["runs"],
        harness=config["harness"]["package"],
    script:
        "../scripts/repo_env.py"


rule bug_candidates:
    input:
        unpack(candidate_inputs),
    output:
        candidates="results/smith/{profile}/candidates/{strategy}/{shard}.jsonl",
        report="results/smith/{profile}/candidates/{strategy}/{shard}.report.json",
    log:
        "logs/smith/{profile}/bug_candidates/{strategy}/{shard}.log",
    conda:
        "../envs/smith.yaml"
    params:
        # recorded in clear: the LM endpoint's credentials redacted (the script reads the real section)
        smith=result_params("smith"),
    script:
        "../scripts/bug_candidates.py"


rule validate_candidates:
    input:
        candidates="results/smith/{profile}/candidates/{strategy}/{shard}.jsonl",
        env="results/smith/{profile}/env.json",
    output:
        reports="results/smith/{profile}/validation/{strategy}/{shard}.jsonl",
    log:
        "logs/smith/{profile}/validate_candidates/{strategy}/{shard}.log",
    conda:
        "../envs/smith.yaml"
    threads: SMITH["validation"]["parallel"]
    params:
        provider=PROVIDER,
        sandbox=result_params("sandbox"),
        validation=result_params("smith.validation"),
        harness=config["harness"]["package"],
        require_p2p=lambda wildcards: SMITH["strategies"][wildcards.strategy].get(
            "require_p2p", True
        ),
    script:
        "../scripts/validate_candidates.py"


rule gather_tasks:
    input:
        env="results/smith/{profile}/env.json",
        bare="results/smith/{profile}/repo.git",
        reports=smith_files(
            "results/smith/{profile}/validation/{strategy}/{shard}.jsonl", SMITH_ALL
        ),
        candidates=smith_files(
            "results/smith/{profile}/candidates/{strategy}/{shard}.jsonl", SMITH_ALL
        ),
    output:
        tasks="results/smith/{profile}/tasks.jsonl",
        git=directory("results/smith/{profile}/tasks.git"),
        summary="results/smith/{profile}/summary.json",
    log:
        "logs/smith/{profile}/gather_tasks.log",
    conda:
        "../envs/smith.yaml"
    script:
        "../scripts/gather_tasks.py"


rule problem_statements:
    input:
        tasks=expand("results/smith/{profile}/tasks.jsonl", profile=SMITH_PROFILES),
    output:
        statements="results/smith/statements/{shard}.jsonl",
    log:
        "logs/smith/problem_statements/{shard}.log",
    conda:
        "../envs/smith.yaml"
    params:
        shards=SMITH["statements"]["shards"],
        # a result: more tries after a rejected statement give more tasks a statement
        attempts=SMITH["statements"]["attempts"],
        lm=result_params("smith.lm"),
    script:
        "../scripts/problem_statements.py"


rule smith_dataset:
    input:
        tasks=expand("results/smith/{profile}/tasks.jsonl", profile=SMITH_PROFILES),
        statements=expand(
            "results/smith/statements/{shard}.jsonl",
            shard=range(SMITH["statements"]["shards"]),
        ),
    output:
        parquet=f"resources/datasets/{SMITH_DATASET}/{SMITH_SPLIT}.parquet",
        report=f"results/smith/{SMITH_DATASET}.dataset.json",
    log:
        f"logs/smith/smith_dataset-{SMITH_DATASET}.log",
    localrule: True
    conda:
        "../envs/smith.yaml"
    script:
        "../scripts/smith_dataset.py"
