#!/usr/bin/env bash
# GPU check of the verl engine (one node, 2+ GPUs, no network; the one-GPU check is gpu_check.py): a small random-weight Qwen3 built here,
# a tiny parquet of prompts, verl 0.9.1's v1 sync trainer run for 2 steps through sweflow's own
# overrides and launch script (Megatron TP 2 + sequence parallel, vLLM TP 2, token TIS, k3 KL) with a
# plain rule reward instead of the agent loop. Prints step time, tokens/s and how far vLLM's logprobs are
# from Megatron's. Budget: under 8 minutes (the trainer run is capped at 420 s).
#   PY=/path/to/python benchmarks/gpu_check_verl.sh   (run from the repository root, in the train-verl env)
set -euo pipefail
PY=${PY:-python}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${WORK:-$(mktemp -d -t sweflow-gpu-check-XXXXXX)}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
T0=$(date +%s)

NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
if (( NGPU < 2 )); then echo "gpu_check: needs 2 GPUs, found $NGPU" >&2; exit 2; fi
echo "gpu_check: $NGPU GPU(s); work dir $WORK"

# 1. model (random weights, saved locally), prompts, rule reward, overrides and launch script
"$PY" - "$WORK" <<'PYEOF'
import json, sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from sweflow.offline.tiny_model import build_tiny_tokenizer
from sweflow.train.recipe import Optim, Parallel, Recipe, check_recipe
from sweflow.train.verl_engine import launch_script, verl_overrides

work = Path(sys.argv[1])
model_dir = build_tiny_tokenizer(work / "model")
tok = AutoTokenizer.from_pretrained(model_dir)
eos = tok.convert_tokens_to_ids("<|im_end|>")
pad = tok.convert_tokens_to_ids("<|endoftext|>")
# Big enough for vLLM's and Megatron's attention kernels (head_dim 64), small enough to load in seconds.
config = Qwen3Config(
    vocab_size=len(tok), hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
    tie_word_embeddings=False, eos_token_id=eos, pad_token_id=pad, bos_token_id=pad, torch_dtype="bfloat16",
)
torch.manual_seed(0)
Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(model_dir)
GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=pad).save_pretrained(model_dir)

rows = [
    {
        "data_source": "gpu_check",
        "prompt": [{"role": "user", "content": f"Count from {i} to {i + 9} in words, please."}],
        "reward_model": {"style": "rule", "ground_truth": "e"},
        "extra_info": {"index": i},
    }
    for i in range(32)
]
pq.write_table(pa.Table.from_pylist(rows), work / "prompts.parquet")
(work / "reward.py").write_text(
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
    "    # share of the letter in ground_truth: varies across samples, so GRPO groups have signal\n"
    "    return solution_str.count(ground_truth) / max(len(solution_str), 1)\n"
)

recipe = Recipe(
    engine="verl", run="gpu-check", prompts_per_step=4, samples_per_prompt=4, global_batch=16,
    micro_batch=4, total_steps=2, save_every=2, optim=Optim(lr=1e-6),
    max_prompt_tokens=128, max_response_tokens=64,
    parallel=Parallel(nodes=1, gpus_per_node=2, tensor=2, context=1),
    verl={"gpu_memory_utilization": 0.35, "overrides": [
        # this check scores with a rule, not with sweflow's agent loop
        "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",
        "actor_rollout_ref.rollout.agent.agent_loop_config_path=null",
        "actor_rollout_ref.rollout.agent.num_workers=2",
        f"reward.custom_reward_function.path={work / 'reward.py'}",
        "reward.custom_reward_function.name=compute_score",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "data.dataloader_num_workers=0",
    ]},
)
check_recipe(recipe)
overrides = verl_overrides(
    recipe, train_files=str(work / "prompts.parquet"), val_files=str(work / "prompts.parquet"),
    model_path=str(model_dir), out_dir=str(work / "out"), agent_loop_config=str(work / "unused.yaml"),
)
(work / "launch.sh").write_text(
    launch_script(recipe, overrides, python=sys.executable, ray_port=6390, log_dir=str(work / "logs"))
)
print("gpu_check: model, prompts and launch script ready")
PYEOF
echo "gpu_check: setup took $(( $(date +%s) - T0 )) s"

# 2. the trainer (local Ray head: no SLURM_JOB_ID)
T1=$(date +%s)
RC=0
env -u SLURM_JOB_ID timeout 420 bash "$WORK/launch.sh" >"$WORK/train.log" 2>&1 || RC=$?
echo "gpu_check: trainer exit $RC after $(( $(date +%s) - T1 )) s (log: $WORK/train.log)"
if (( RC != 0 )); then tail -n 60 "$WORK/train.log" >&2; fi

# 3. the numbers
"$PY" - "$WORK" "$RC" <<'PYEOF'
import json, sys
from pathlib import Path

from sweflow.train.verl_metrics import convert_verl_log

work, rc = Path(sys.argv[1]), int(sys.argv[2])
files = sorted((work / "logs" / "verl_metrics").glob("*.jsonl"))
steps = [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]
steps = [s for s in steps if "training/global_step" in s.get("data", {})]
if not steps:
    print("gpu_check: FAILED - verl logged no training step", file=sys.stderr)
    sys.exit(1)
keys = [
    "timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/update_weights",
    "perf/total_num_tokens", "perf/throughput", "critic/score/mean", "actor/pg_loss", "actor/kl_loss",
    "actor/grad_norm", "rollout_corr/rollout_is_mean", "rollout_corr/kl", "rollout_corr/k3_kl",
    "rollout_corr/log_ppl_abs_diff", "training/rollout_probs_diff_mean", "training/rollout_probs_diff_max",
]
for s in steps:
    d = s["data"]
    tokens_per_s = d["perf/total_num_tokens"] / d["perf/time_per_step"] if d.get("perf/time_per_step") else None
    print(f"--- step {s['step']}")
    for k in keys:
        if k in d:
            print(f"  {k:36s} {d[k]:.6g}")
    print(f"  {'tokens/s (job)':36s} {tokens_per_s:.6g}" if tokens_per_s else "  tokens/s: n/a")
last = steps[-1]["data"]
print("gpu_check: step time %.2f s, tokens/s %.1f" % (last["timing_s/step"], last["perf/total_num_tokens"] / last["perf/time_per_step"]))
# verl has no per-token mean |logp_vllm - logp_megatron|: rollout_corr/kl is the signed mean of
# logp_rollout - logp_old, k3_kl ~ 0.5 E[d^2] (so sqrt(2 k3) ~ the RMS logprob gap), and
# training/rollout_probs_diff_mean is the mean |p_megatron - p_vllm| in probability space.
k3 = last.get("rollout_corr/k3_kl")
print("gpu_check: logprob gap vLLM vs Megatron: mean(logp_vllm - logp_megatron) %s, RMS ~ %s, mean |p diff| %s" % (
    last.get("rollout_corr/kl"), (2 * k3) ** 0.5 if k3 is not None and k3 >= 0 else None,
    last.get("training/rollout_probs_diff_mean")))
n = convert_verl_log(work / "logs" / "verl_metrics", work / "metrics.jsonl")
print(f"gpu_check: metrics.jsonl with {n} step(s): {(work / 'metrics.jsonl').read_text().splitlines()[-1]}")
ckpts = sorted(p.name for p in (work / "out" / "checkpoints").glob("global_step_*"))
print(f"gpu_check: checkpoints {ckpts}")
ok = rc == 0 and len(steps) >= 2 and ckpts
print("gpu_check: OK" if ok else "gpu_check: FAILED", file=sys.stdout if ok else sys.stderr)
sys.exit(0 if ok else 1)
PYEOF
echo "gpu_check: total $(( $(date +%s) - T0 )) s"
