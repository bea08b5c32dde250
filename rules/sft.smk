# SFT branch (SWE-smith's recipe): expert trajectories on the validated tasks (Claude Code in each task's
# sandbox, its model calls through the proxy's pass-through mode to sft.collect.expert) -> every patch graded
# in a fresh sandbox (resolved and integrity-clean ones kept) -> chat messages in two forms (tool calls with
# schemas; SWE-smith's text form) -> TRL SFTTrainer on train.model.


wildcard_constraints:
    shard=r"\d+",
    run=r"[A-Za-z0-9][A-Za-z0-9._-]*",


# Each shard reads its own tasks' row files (rules/common.smk: sft_rows), and every task's attempts are kept
# in a cache outside results/ (resources/cache/sft-collect/, keyed on the task row and the settings that make
# a trajectory): a shard that reruns never buys an unchanged task's trajectories again.
rule collect_trajectories:
    input:
        jsonl=sft_rows,
        template_map="results/{dataset}/template-map.json",
        parquet=expert_parquet,
    output:
        predictions="results/{dataset}/sft/predictions/{split}/{shard}.jsonl.gz",
    log:
        "logs/{dataset}/collect_trajectories/{split}/{shard}.log",
    conda:
        "../envs/agent.yaml"
    threads: SFT["collect"]["max_concurrency"]
    params:
        # the key's variable name only: the script reads the value from its environment
        collect=result_params("sft.collect"),
        provider=PROVIDER,
        sandbox=result_params("sandbox"),
        shape=dataset_setting("shape"),
    script:
        "../scripts/collect_trajectories.py"


rule evaluate_predictions:
    input:
        predictions="results/{dataset}/sft/predictions/{split}/{shard}.jsonl.gz",
        jsonl=sft_rows,
    output:
        evaluations="results/{dataset}/sft/evaluations/{split}/{shard}.jsonl",
        evidence="results/{dataset}/sft/evaluations/{split}/{shard}.evidence.jsonl.gz",
    log:
        "logs/{dataset}/evaluate_predictions/{split}/{shard}.log",
    conda:
        "../envs/agent.yaml"
    threads: SFT["evaluate"]["parallel"]
    params:
        provider=PROVIDER,
        sandbox=result_params("sandbox"),
    script:
        "../scripts/evaluate_predictions.py"


rule traj_to_messages:
    input:
        predictions=sft_files(
            "results/{dataset}/sft/predictions/{split}/{shard}.jsonl.gz"
        ),
        evaluations=sft_files("results/{dataset}/sft/evaluations/{split}/{shard}.jsonl"),
        extra=[e["path"] for e in SFT["messages"]["extra"]],
    output:
        tools="results/{dataset}/sft/messages/tools.jsonl",
        text="results/{dataset}/sft/messages/text.jsonl",
        summary="results/{dataset}/sft/messages/summary.json",
    log:
        "logs/{dataset}/traj_to_messages.log",
    # seconds of work on small files: not worth a cluster job
    localrule: True
    conda:
        "../envs/sft.yaml"
    params:
        extra=canonical(SFT["messages"]["extra"]),
    script:
        "../scripts/traj_to_messages.py"


# One allocation of `nodes` nodes under profiles/slurm; accelerate (FSDP2) starts one process per GPU.
rule train_sft:
    input:
        messages=f"results/{{dataset}}/sft/messages/{SFT['train']['form']}.jsonl",
        model=f"models/{MODEL_NAME}/hf",
    output:
        summary="results/{dataset}/sft/train/{run}/summary.json",
        metrics="results/{dataset}/sft/train/{run}/metrics.jsonl",
        final=directory("results/{dataset}/sft/train/{run}/final"),
    log:
        "logs/{dataset}/train_sft/{run}.log",
    conda:
        "../envs/sft.yaml"
    threads: 64
    resources:
        nodes=SFT_NODES,
        tasks=SFT_NODES,
        tasks_per_gpu=0,
        mpi="srun" if SFT_NODES > 1 else "",
        gres=f"gpu:{SFT_GPUS}" if SFT_GPUS else "",
        slurm_extra="--ntasks-per-node=1 --exclusive",
    params:
        train=result_params("sft.train"),
    script:
        "../scripts/train_sft.py"


rule sft:
    input:
        SFT_TARGETS,
