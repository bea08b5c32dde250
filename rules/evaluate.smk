# Evaluate stage: each checkpoint named in evaluate.checkpoints attempts every valid task of the held-out
# split evaluate.attempts times (the agent through the proxy, on the engine serving the checkpoint: local
# transformers, or with evaluate.engine vllm a vLLM server the job starts on its GPUs),
# every patch graded in a fresh sandbox by the training's rules; pass@1 with its interval, pass@k, and
# SWE-bench's predictions.jsonl and report.json (sweflow.stages.evaluate). One job per checkpoint: a rerun
# evaluates only the checkpoints whose weights changed. Predictions files made elsewhere
# (evaluate.predictions) are graded on the same tasks.


rule evaluate_checkpoint:
    input:
        model=checkpoint_model,
        tasks="results/{dataset}/{split}/tasks.valid.jsonl",
        template_map="results/{dataset}/template-map.json",
    output:
        summary="results/{dataset}/eval/{split}/{checkpoint}/summary.json",
        attempts="results/{dataset}/eval/{split}/{checkpoint}/attempts.jsonl",
        predictions="results/{dataset}/eval/{split}/{checkpoint}/predictions.jsonl",
        report="results/{dataset}/eval/{split}/{checkpoint}/report.json",
        evidence="results/{dataset}/eval/{split}/{checkpoint}/evidence.jsonl.gz",
    log:
        "logs/{dataset}/evaluate_checkpoint/{split}/{checkpoint}.log",
    wildcard_constraints:
        checkpoint=r"base|warm_start|grpo|sft",
    priority: 10
    conda:
        "../envs/train-verl.yaml" if EVAL_VLLM else "../envs/train.yaml"
    threads: config["evaluate"]["parallel"]
    resources:
        # the vLLM server's GPUs (tensor parallel); none for the local engine
        gres=(
            f"gpu:{config['evaluate']['vllm']['tensor_parallel_size']}"
            if EVAL_VLLM
            else ""
        ),
    params:
        provider=PROVIDER,
        evaluate=result_params("evaluate", without=("predictions",)),
        sandbox=result_params("sandbox"),
        recipe=eval_recipe_params(),
    script:
        "../scripts/evaluate_checkpoint.py"


rule grade_predictions:
    input:
        predictions=outside_predictions,
        tasks="results/{dataset}/{split}/tasks.valid.jsonl",
        template_map="results/{dataset}/template-map.json",
    output:
        report="results/{dataset}/eval/{split}/predictions-{name}/report.json",
        graded="results/{dataset}/eval/{split}/predictions-{name}/graded.jsonl",
        evidence="results/{dataset}/eval/{split}/predictions-{name}/evidence.jsonl.gz",
    log:
        "logs/{dataset}/grade_predictions/{split}/{name}.log",
    conda:
        "../envs/agent.yaml"
    params:
        provider=PROVIDER,
        sandbox=result_params("sandbox"),
    script:
        "../scripts/grade_predictions.py"
