"""Benchmark the TRL engine on CPU with toy rollouts shaped like a Claude Code session.

    .venv/bin/python benchmarks/bench_train.py                          # both presets, 3 steps
    .venv/bin/python benchmarks/bench_train.py --preset tiny-swa --steps 2 --prompt-tokens 3400

The rollouts are a toy environment (no sandbox, no proxy): per sample, the live policy generates half the
model tokens after a ~3400-token prompt, a span of "tool output" tokens follows (loss-masked, logprob 0),
then the policy generates the other half after everything so far, as a multi-turn agent session would.
Reward = the share of generated tokens in a fixed target set. Training is sweflow.train.trl_engine.train_trl
(GRPOTrainer + sweflow's rollout function, advantages and loss) on the "tiny" and/or "tiny-swa" model.

Prints, per preset: seconds per step split into rollout / train / weight sync (from the metrics.jsonl lines
trl_engine writes), tokens per second, peak RSS (resource.getrusage) for the preset's own process; then one
JSON summary line. Each preset runs in its own process, so its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PRESETS = ("tiny", "tiny-swa")


class SessionRollouts:
    """Toy rollouts over the live policy engine: model turn, masked tool output, model turn."""

    def __init__(self, engine, *, vocab: int, prompt_tokens: int, completion_tokens: int, tool_tokens: int):
        self.engine = engine
        rng = random.Random(0)
        self.prompt_ids = [rng.randrange(10, vocab) for _ in range(prompt_tokens)]
        model_tokens = max(2, completion_tokens - tool_tokens)
        self.first, self.second = model_tokens // 2, model_tokens - model_tokens // 2
        self.tool_ids = [rng.randrange(10, vocab) for _ in range(tool_tokens)]
        self.target = set(range(40, 40 + vocab // 6))
        self.generated = 0
        self.generate_s = 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def run(self, jobs, prefix=""):
        from sweflow.proxy.engines import SamplingParams
        from sweflow.rollout.types import RolloutResult

        out = []
        for row, g in jobs:
            iid = row["metadata"]["instance_id"]
            t0 = time.monotonic()
            a = self.engine.generate(self.prompt_ids, SamplingParams(max_tokens=self.first))
            context = self.prompt_ids + a.output_ids + self.tool_ids
            b = self.engine.generate(context, SamplingParams(max_tokens=self.second))
            self.generate_s += time.monotonic() - t0
            gen = a.output_ids + b.output_ids
            self.generated += len(gen)
            p, t = len(self.prompt_ids), len(self.tool_ids)
            sample = {
                "token_ids": context + b.output_ids,
                "loss_mask": [0] * p + [1] * len(a.output_ids) + [0] * t + [1] * len(b.output_ids),
                "rollout_logprobs": [0.0] * p + a.logprobs + [0.0] * t + b.logprobs,
                "prompt_length": p,
            }
            reward = sum(x in self.target for x in gen) / len(gen)
            out.append(
                RolloutResult(
                    iid,
                    g,
                    f"{prefix}{iid}:{g}",
                    "completed",
                    None,
                    reward=reward,
                    samples=[sample],
                    num_turns=2,
                )
            )
        return out


def run_preset(args) -> dict:
    """One preset in this process: build the model, train `args.steps` steps, read metrics.jsonl."""
    import os

    import torch
    from transformers import AutoTokenizer

    from sweflow.offline.tiny_model import build_tiny_model
    from sweflow.train.recipe import Optim, Recipe, check_recipe
    from sweflow.train.trl_engine import train_trl

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="sweflow-bench-train-") as tmp:
        tmp = Path(tmp)
        model_dir = build_tiny_model(tmp / "model", args.preset)
        vocab = len(AutoTokenizer.from_pretrained(str(model_dir)))
        n = args.samples
        recipe = Recipe(
            engine="trl",
            run="bench",
            prompts_per_step=args.prompts,
            samples_per_prompt=n,
            global_batch=args.prompts * n,
            micro_batch=args.micro_batch,
            total_steps=args.steps,
            save_every=args.steps,
            optim=Optim(lr=1e-4, weight_decay=0.0),
            max_prompt_tokens=args.prompt_tokens + 16,
            max_response_tokens=args.completion_tokens + 16,
            max_concurrency=1,
        )
        check_recipe(recipe)
        made = {}

        def factory(engine):
            made["r"] = SessionRollouts(
                engine,
                vocab=vocab,
                prompt_tokens=args.prompt_tokens,
                completion_tokens=args.completion_tokens,
                tool_tokens=args.tool_tokens,
            )
            return made["r"]

        rows = [
            {"prompt": [{"role": "user", "content": f"task {i}"}], "metadata": {"instance_id": f"bench-{i}"}}
            for i in range(args.prompts)
        ]
        t0 = time.monotonic()
        summary = train_trl(
            recipe, rows=rows, model_dir=model_dir, out_dir=tmp / "run", rollouts_factory=factory
        )
        wall = time.monotonic() - t0
        metrics = [json.loads(x) for x in (tmp / "run" / "metrics.jsonl").read_text().splitlines() if x]
        params = sum(p.numel() for p in _load(model_dir).parameters())
    toy = made["r"]
    samples = recipe.samples_per_step
    seq = args.prompt_tokens + args.completion_tokens
    rollout = [m["rollout_s"] for m in metrics]
    train = [m["train_s"] for m in metrics]
    sync = [m["weight_sync_s"] for m in metrics]
    trained_tokens = samples * seq  # every token goes through the forward; the loss sees the model's only
    return {
        "preset": args.preset,
        "params": params,
        "steps": len(metrics),
        "samples_per_step": samples,
        "prompt_tokens": args.prompt_tokens,
        "completion_tokens": args.completion_tokens,
        "tool_tokens": args.tool_tokens,
        "rollout_s_per_step": round(statistics.mean(rollout), 3),
        "train_s_per_step": round(statistics.mean(train), 3),
        "weight_sync_s_per_step": round(statistics.mean(sync), 6),
        "step_s": round(statistics.mean(r + t for r, t in zip(rollout, train, strict=True)), 3),
        "generated_tokens_per_s": round(toy.generated / toy.generate_s, 1) if toy.generate_s else None,
        "train_tokens_per_s": round(trained_tokens / statistics.mean(train), 1),
        "engine_tokens_per_s": round(statistics.mean(m["tokens_per_s"] for m in metrics), 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "reward_first": metrics[0]["reward_mean"],
        "reward_last": metrics[-1]["reward_mean"],
        "wall_s": round(wall, 1),
        "train_loss": summary["train_loss"],
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "per_step": [
            {
                k: m.get(k)
                for k in (
                    "step",
                    "rollout_s",
                    "train_s",
                    "weight_sync_s",
                    "tokens_per_s",
                    "grad_norm",
                    "tis_weight_mean",
                    "tis_clipped_share",
                    "reward_mean",
                    "reward_std",
                    "groups_with_gradient",
                )
            }  # fmt: skip
            for m in metrics
        ],
    }


def _load(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir))


def _print_preset(res: dict) -> None:
    print(
        f"{res['preset']:>9}: {res['params'] / 1e6:.2f}M params, {res['samples_per_step']} samples/step of "
        f"{res['prompt_tokens']}+{res['completion_tokens']} tokens ({res['tool_tokens']} tool-output masked)"
    )
    for s in res["per_step"]:
        print(
            f"           step {s['step']}: rollout {s['rollout_s']:.2f}s  train {s['train_s']:.2f}s  "
            f"sync {s['weight_sync_s']:.6f}s  {s['tokens_per_s']} tok/s"
        )
    print(
        f"           mean: step {res['step_s']:.2f}s = rollout {res['rollout_s_per_step']:.2f}s + train "
        f"{res['train_s_per_step']:.2f}s (sync {res['weight_sync_s_per_step']:.6f}s); generation "
        f"{res['generated_tokens_per_s']} tok/s, training {res['train_tokens_per_s']} tok/s; "
        f"peak RSS {res['peak_rss_mib']} MiB"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--preset", choices=(*PRESETS, "both"), default="both")
    ap.add_argument("--prompt-tokens", type=int, default=3400)
    ap.add_argument("--completion-tokens", type=int, default=600)
    ap.add_argument(
        "--tool-tokens", type=int, default=200, help="masked tool-output span inside the completion"
    )
    ap.add_argument("--prompts", type=int, default=1, help="prompts per step")
    ap.add_argument("--samples", type=int, default=4, help="samples per prompt (group size)")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run_preset(args)))
        return 0
    presets = PRESETS if args.preset == "both" else (args.preset,)
    results = []
    for preset in presets:
        cmd = [sys.executable, __file__, "--child", "--preset", preset]
        for k in ("steps", "prompt_tokens", "completion_tokens", "tool_tokens", "prompts", "samples"):
            cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
        cmd += ["--micro-batch", str(args.micro_batch), "--threads", str(args.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
            print(json.dumps({"preset": preset, "error": f"exit {proc.returncode}"}))
            return 1
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        _print_preset(res)
        results.append(res)
    summary = {
        "bench": "train_trl_cpu",
        "steps": args.steps,
        "presets": {
            r["preset"]: {k: v for k, v in r.items() if k not in ("preset", "per_step")} for r in results
        },
    }
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
