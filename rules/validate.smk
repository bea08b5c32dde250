# Validation stage: in fresh sandboxes the gold patch must resolve and the empty patch must not (each
# `validation.repeats` times, to catch flaky tests); broken tasks are reported and left out of training.
# An infrastructure failure (dead sandbox, provider fault) is retried `validation.error_attempts` times;
# still failing, the task's verdict is `error`: reported under `errors`, left out of tasks.valid.jsonl,
# and validated again by the next run (the summary removes its result; the run dates the summary back).
# A task whose gold runs carried no canary is `unguarded`: reported, and left out of tasks.valid.jsonl
# unless `validation.allow_unguarded`.
# The evidence file next to each verdict holds every evaluation's whole log and status map (gzip JSON).


# The gold patch comes from the split parquet (never from the JSONL); each task gets its own byte-stable
# input file, so a changed row re-validates one task only.
checkpoint validation_tasks:
    input:
        jsonl="results/{dataset}/{split}.jsonl",
        parquet="resources/datasets/{dataset}/{split}.parquet",
    output:
        tasks=directory("results/{dataset}/{split}/validation-tasks"),
        listing="results/{dataset}/{split}/validation-tasks.txt",
    log:
        "logs/{dataset}/validation_tasks/{split}.log",
    # about a second or less of work on small files: not worth a cluster job
    localrule: True
    conda:
        "../envs/agent.yaml"
    params:
        shape=dataset_setting("shape"),
    script:
        "../scripts/validation_tasks.py"


rule validate_task:
    input:
        task="results/{dataset}/{split}/validation-tasks/{instance_id}.json",
    output:
        result="results/{dataset}/{split}/validation/{instance_id}.json",
        evidence="results/{dataset}/{split}/validation/{instance_id}.evidence.jsonl.gz",
    log:
        "logs/{dataset}/validate_task/{split}/{instance_id}.log",
    wildcard_constraints:
        instance_id=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    conda:
        "../envs/agent.yaml"
    threads: config["validation"]["parallel"]
    params:
        provider=PROVIDER,
        sandbox=result_params("sandbox"),
        # allow_unguarded only decides which verdicts the summary keeps: no task is validated again
        validation=result_params("validation", without=("allow_unguarded",)),
    script:
        "../scripts/validate_task.py"


rule validation_summary:
    input:
        jsonl="results/{dataset}/{split}.jsonl",
        results=validation_results,
    output:
        summary="results/{dataset}/{split}/validation-summary.json",
        valid="results/{dataset}/{split}/tasks.valid.jsonl",
    log:
        "logs/{dataset}/validation_summary/{split}.log",
    # about a second or less of work on small files: not worth a cluster job
    localrule: True
    conda:
        "../envs/agent.yaml"
    params:
        allow_unguarded=config["validation"]["allow_unguarded"],
    script:
        "../scripts/validation_summary.py"


# One row file per valid task (the line of tasks.valid.jsonl), byte-stable: the e2e check and the SFT shards
# read their own tasks' files (rules/common.smk: e2e_rows, sft_rows), so one changed verdict reruns only the
# work of its task. A checkpoint, so that jobs whose files kept their bytes are not planned again.
checkpoint valid_rows:
    input:
        valid="results/{dataset}/{split}/tasks.valid.jsonl",
    output:
        rows=directory("results/{dataset}/{split}/valid-rows"),
        listing="results/{dataset}/{split}/valid-rows.txt",
    log:
        "logs/{dataset}/valid_rows/{split}.log",
    # well under a second of work on small files: not worth a cluster job
    localrule: True
    conda:
        "../envs/agent.yaml"
    script:
        "../scripts/valid_rows.py"
