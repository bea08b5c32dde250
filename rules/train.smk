# Train stage: the model (Hub revision -> sha -> snapshot -> Megatron checkpoint), an optional warm start
# on the e2e check's recorded sessions, and synchronous GRPO on the split's validated tasks: ONE rule that
# the Slurm profile runs as one allocation of train.parallel.nodes nodes (sweflow.stages.train).


rule resolve_model:
    output:
        revision="models/{model}/revision.json",
    log:
        "logs/models/{model}/resolve_model.log",
    localrule: True
    conda:
        "../envs/data.yaml"
    params:
        repo_id=TRAIN_MODEL["repo_id"],
        revision=TRAIN_MODEL["revision"],
        endpoint=redact(MODEL_ENDPOINT or "") or None,
    script:
        "../scripts/resolve_model.py"


rule download_model:
    input:
        revision="models/{model}/revision.json",
    output:
        hf=directory("models/{model}/hf"),
        manifest="models/{model}/hf.manifest.json",
    log:
        "logs/models/{model}/download_model.log",
    retries: 1
    localrule: True
    conda:
        "../envs/data.yaml"
    params:
        endpoint=redact(MODEL_ENDPOINT or "") or None,
        allow_patterns=TRAIN_MODEL["allow_patterns"],
    script:
        "../scripts/download_model.py"


# GPU stack only (envs/train-verl.yaml): part of the production target, not of the embedded default.
rule megatron_checkpoint:
    input:
        hf="models/{model}/hf",
        manifest="models/{model}/hf.manifest.json",
    output:
        dist=directory("models/{model}/torch_dist"),
        record="models/{model}/torch_dist.json",
    log:
        "logs/models/{model}/megatron_checkpoint.log",
    conda:
        "../envs/train-verl.yaml"
    resources:
        gpu=TRAIN_MODEL["megatron"]["gpus"],
    params:
        tp=TRAIN["parallel"]["tensor"],
        gpus=TRAIN_MODEL["megatron"]["gpus"],
        converter=TRAIN_MODEL["megatron"]["converter"],
    script:
        "../scripts/megatron_checkpoint.py"


rule warm_start:
    input:
        hf=f"models/{MODEL_NAME}/hf",
        trajectories=e2e_trajectories,
    output:
        model=directory("results/{dataset}/warm_start/{model}/hf"),
        summary="results/{dataset}/warm_start/{model}/summary.json",
    log:
        "logs/{dataset}/warm_start/{model}.log",
    # the embedded run's critical path (e2e check -> warm start -> GRPO -> its evaluation): scheduled before
    # the SWE-smith validations that would otherwise hold the cores (local scheduling only)
    priority: 10
    conda:
        "../envs/train.yaml"
    params:
        steps=TRAIN["warm_start"]["steps"],
        lr=TRAIN["warm_start"]["lr"],
        seed=TRAIN["seed"],
    script:
        "../scripts/warm_start.py"


from sweflow.stages.common import grpo_retries, slurm_signal_option

GRPO_RETRIES = grpo_retries(
    TRAIN["total_steps"], TRAIN["save_every"], main_process=workflow.is_main_process
)


# One allocation of `nodes` nodes under profiles/slurm: the verl engine's launcher starts Ray on every node
# with srun (mpi="srun": the shell runs in the batch step itself); the TRL engine runs on the first node.
# The run's tensorboard/ and wandb/ folders (train.tracking) are written beside the outputs, not declared:
# event files carry timestamps, nothing downstream reads them, and a resumed run appends to them.
rule train_grpo:
    input:
        tasks=f"results/{{dataset}}/{TRAIN['split']}/tasks.valid.jsonl",
        # which valid tasks got no FAIL_TO_PASS twin (left out of RL unless train.allow_twinless)
        validation=f"results/{{dataset}}/{TRAIN['split']}/validation-summary.json",
        model=grpo_model,
        template_map="results/{dataset}/template-map.json",
        megatron=grpo_megatron,
    output:
        summary="results/{dataset}/grpo/{run}/summary.json",
        metrics="results/{dataset}/grpo/{run}/metrics.jsonl",
        rollouts=directory("results/{dataset}/grpo/{run}/rollouts"),
        final=directory("results/{dataset}/grpo/{run}/final"),
    log:
        "logs/{dataset}/train_grpo/{run}.log",
    priority: 10
    # Slurm's time limit (sweflow.train.preempt, docs/slurm.md): the trainer saves and stops at a step boundary
    # before it, and a new job resumes from that checkpoint, as often as the run has save intervals
    retries: GRPO_RETRIES
    conda:
        "../envs/train-verl.yaml" if TRAIN["engine"] == "verl" else "../envs/train.yaml"
    # every core the run gives it (local runs cap threads at --cores; on a cluster workflow.cores is undefined,
    # so the profile sets it per node with set-threads)
    threads: 64
    resources:
        nodes=TRAIN_NODES,
        tasks=TRAIN_NODES,
        tasks_per_gpu=0,
        # the shell runs in the batch step and starts one task per node itself (srun); the plugin wants
        # more than one task for that, so a one-node run is a plain job
        mpi="srun" if TRAIN_NODES > 1 else "",
        # GPUs per node (gres is per node; the plugin's gpu= would be a per-job total)
        gres=f"gpu:{TRAIN_GPUS}" if TRAIN_GPUS else "",
        slurm_extra=f"--ntasks-per-node=1 --exclusive {slurm_signal_option()}",
        # Snakemake's attempt number, which a script sees only through its resources
        attempt=lambda wildcards, attempt: attempt,
    params:
        provider=PROVIDER,
        # secrets stay out of params (recorded in clear): the script reads the live sections from config
        train=result_params("train"),
        sandbox=result_params("sandbox"),
    script:
        "../scripts/train_grpo.py"


rule train:
    input:
        summary=TRAIN_TARGETS,
