# Data stage: Hub revision -> parquet -> validated split -> per-image records -> training JSONL.


rule resolve_dataset:
    input:
        offline=offline_files,
    output:
        revision="resources/datasets/{dataset}/revision.json",
    log:
        "logs/{dataset}/resolve_dataset.log",
    wildcard_constraints:
        dataset=HUB_WILDCARD,
    localrule: True
    conda:
        "../envs/data.yaml"
    params:
        repo_id=config["dataset"]["repo_id"],
        repo_type=config["dataset"]["repo_type"],
        revision=config["dataset"]["revision"],
        endpoint=HUB_ENDPOINT_PARAM,
        offline_dir=config["dataset"]["hub"]["offline_dir"],
    script:
        "../scripts/resolve_dataset.py"


# The resolved sha is the content of revision.json: a new upstream commit (found by a first resolve or by
# `sweflow refresh`, which rewrites the file only when the sha moved) re-runs the download, and by checksum
# only what changed downstream.
rule download:
    input:
        revision="resources/datasets/{dataset}/revision.json",
        offline=offline_files,
    output:
        parquet="resources/datasets/{dataset}/{split}.parquet",
    log:
        "logs/{dataset}/download/{split}.log",
    wildcard_constraints:
        dataset=HUB_WILDCARD,
    retries: 1
    localrule: True
    conda:
        "../envs/data.yaml"
    params:
        filename=split_file,
        endpoint=HUB_ENDPOINT_PARAM,
        offline_dir=config["dataset"]["hub"]["offline_dir"],
    script:
        "../scripts/download.py"


rule validate_split:
    input:
        parquet="resources/datasets/{dataset}/{split}.parquet",
    output:
        report="results/{dataset}/{split}/rows.report.json",
    log:
        "logs/{dataset}/validate_split/{split}.log",
    # about a second or less of work on small files: not worth a cluster job
    localrule: True
    conda:
        "../envs/data.yaml"
    params:
        expected_rows=expected_rows,
        shape=dataset_setting("shape"),
        max_problem_statement_chars=config["dataset"]["max_problem_statement_chars"],
    script:
        "../scripts/validate_split.py"


checkpoint list_images:
    input:
        parquets=dataset_files("resources/datasets/{dataset}/{split}.parquet"),
        reports=dataset_files("results/{dataset}/{split}/rows.report.json"),
    output:
        images=directory("results/{dataset}/images"),
        listing="results/{dataset}/images.txt",
    log:
        "logs/{dataset}/list_images.log",
    # about a second or less of work on small files: not worth a cluster job
    localrule: True
    conda:
        "../envs/data.yaml"
    params:
        splits=dataset_setting("splits"),
        naming=dataset_setting("naming"),
        shape=dataset_setting("shape"),
        limit=dataset_setting("limit"),
    script:
        "../scripts/list_images.py"


rule template_map:
    input:
        records=template_records,
    output:
        map="results/{dataset}/template-map.json",
        failures="results/{dataset}/template-failures.json",
    log:
        "logs/{dataset}/template_map.log",
    # about a second or less of work on small files: not worth a cluster job
    localrule: True
    conda:
        "../envs/data.yaml"
    params:
        prebuilt=config["sandbox"]["prebuilt"],
    script:
        "../scripts/template_map.py"


rule convert:
    input:
        parquet="resources/datasets/{dataset}/{split}.parquet",
        report="results/{dataset}/{split}/rows.report.json",
        map="results/{dataset}/template-map.json",
        failures="results/{dataset}/template-failures.json",
    output:
        jsonl="results/{dataset}/{split}.jsonl",
        report="results/{dataset}/{split}.convert.json",
    log:
        "logs/{dataset}/convert/{split}.log",
    conda:
        "../envs/data.yaml"
    # one process: at SWE-Gym's 2,438 rows two forked workers were no faster and used 1.9x the memory
    # (benchmarks/bench_convert_recipe.py); --set-threads convert=N splits a larger split into N runs of rows
    # (the same bytes with any number)
    threads: 1
    params:
        shape=dataset_setting("shape"),
        limit=dataset_setting("limit"),
        max_problem_statement_chars=config["dataset"]["max_problem_statement_chars"],
        provider=PROVIDER,
        harness=dataset_setting("harness"),
        agent=result_params("agent"),
        sandbox_timeout_sec=config["sandbox"]["timeout_sec"],
        naming=dataset_setting("naming"),
    script:
        "../scripts/convert.py"
