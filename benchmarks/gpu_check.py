"""The one-GPU check: the figures a first production run depends on, from one GPU and nothing downloaded.

    python3 benchmarks/gpu_check.py OUT.json                  # one H200 (or H100): under 8 minutes
    python3 benchmarks/gpu_check.py OUT.json --reduced        # CPU, tiny sizes, the same code (CI runs it)

Parts, each in its own process (its peak memory is its own; a failure is reported, the rest still run):
- `peak`: the lent card's own bf16 matmul peak (TFLOP/s of square matmuls, median of many), the figure MFU
  is taken against (an H100's and an H200's differ; `--peak-tflops` overrides it), beside the datasheet's
  dense bf16 figure for the card's name (`DATASHEET_TFLOPS`).
- `model`: the recipe's model shape on the trainer side. A Qwen3.5 model at Qwen3.5-4B's published sizes
  (sweflow.models.megatron_qwen35.QWEN35_4B, random weights), bf16, gradient checkpointing, forward +
  backward at 16k, 32k and 64k tokens through a head computed in chunks of 1,024 tokens (the recipe's
  log-prob chunk): tokens/s, MFU against the `peak` part's figure, peak memory; then the same length
  with the whole-sequence head of transformers' own loss, whose extra peak is the logits' share.
- `logprob`: rollout/trainer agreement. The same model with a sharpened head (scaled so the next-token
  distribution is not flat) decodes with its cache (GDN's recurrent path, as a rollout engine does), then
  one teacher-forced forward of the same tokens (the chunked path, as the trainer does): mean, p99 and max
  |delta logp|, and the share of tokens whose token-TIS weight exp(train - rollout) would clip at 2.
- `grpo`: sweflow's own training on the device. Two TRL GRPO steps of benchmarks/bench_train.py's
  multi-turn toy session (prompt, model turn, masked tool output, model turn) on the tiny-swa model: step
  time split, grad norm, TIS weight mean and clipped share.

Prints one JSON line and writes it to OUT.json. The GDN kernels are flash-linear-attention's when a carried
wheel provides them (`gdn_kernel: "fla"`), else transformers' torch code (`"torch"`). What the GPU machine's
image lacks travels as the wheels in benchmarks/gpu_wheels.txt (`make gpu-wheels`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

PARTS = ("peak", "model", "logprob", "grpo")
# Dense bf16 tensor-core figures from the vendors' datasheets, by the name torch reports (SXM parts); MFU is
# taken against the card's measured peak (`part_peak`), these are printed beside it for reference.
DATASHEET_TFLOPS = {"H100 80GB HBM3": 989.4, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H200": 989.4}
BUDGET_S = 450  # the whole check stays under 8 minutes on one H200


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What one mode runs: the full check or its reduced CPU twin."""

    lengths: tuple[int, ...]
    head_chunk: int
    iters: int
    prompt: int
    decode: int
    grpo_preset: str
    grpo_prompt: int
    grpo_completion: int
    grpo_tool: int
    grpo_samples: int
    peak_n: int
    peak_batches: int


FULL = Sizes((16384, 32768, 65536), 1024, 2, 1024, 256, "tiny-swa", 3400, 600, 200, 4, 8192, 20)
REDUCED = Sizes((64, 128, 256), 32, 1, 32, 24, "tiny", 48, 24, 6, 4, 128, 3)


def arch(reduced: bool):
    from sweflow.models.megatron_qwen35 import QWEN35_4B

    if not reduced:
        return QWEN35_4B
    # the same hybrid (three GDN layers, then one gated full-attention layer), a few thousand times smaller
    return dataclasses.replace(
        QWEN35_4B, num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
        num_query_groups=2, head_dim=16, vocab_size=512, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------- shared
def device_info() -> dict:
    import torch

    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        return {"device": "cuda", "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1)}
    return {"device": "cpu", "name": "cpu", "threads": torch.get_num_threads()}


def gdn_paths() -> dict:
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    return {
        "gdn_kernel": "fla" if m.chunk_gated_delta_rule is not None else "torch",
        "conv1d": "causal_conv1d" if m.causal_conv1d_fn is not None else "torch",
    }


def build_model(a, device: str):
    """A random-weight Qwen3_5ForCausalLM of architecture `a`, created on `device` in bf16."""
    import torch
    from transformers import Qwen3_5ForCausalLM

    from sweflow.models.megatron_qwen35 import hf_text_config

    config = hf_text_config(a)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen3_5ForCausalLM(config)
    finally:
        torch.set_default_dtype(before)
    return model


class Memory:
    """Peak memory of one region: the CUDA allocator's on a GPU, the process's max RSS growth on CPU."""

    def __init__(self, device: str):
        self.device = device

    def reset(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            return round(torch.cuda.max_memory_allocated() / 2**30, 2)
        return None  # RSS never shrinks, so a per-region CPU peak would mislead


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def model_flops(model, a, tokens: int) -> float:
    """Model FLOPs of one forward + backward of `tokens` tokens (recomputation not counted, as MFU does).

    6 per parameter-token for every matrix (the embedding lookup is none); causal attention scores and values
    of the full-attention layers, 6 * L^2 * heads * head_dim each; the GDN layers' state update and
    intra-chunk products, about 6 * L * value_heads * key_dim * value_dim * 3 each (an estimate).
    """
    from sweflow.models.megatron_qwen35 import layer_kinds

    matrix = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n and p.dim() >= 2)
    kinds = layer_kinds(a)
    attn = kinds.count("attention") * 6 * tokens**2 * a.num_attention_heads * a.head_dim
    gdn = (
        kinds.count("gdn")
        * 18
        * tokens
        * a.linear_num_value_heads
        * a.linear_key_head_dim
        * a.linear_value_head_dim
    )
    return 6.0 * matrix * tokens + attn + gdn


def chunked_loss(model, ids, chunk: int):
    """Next-token loss with the head applied `chunk` tokens at a time, each chunk recomputed in backward."""
    import torch
    from torch.utils.checkpoint import checkpoint

    hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
    head = model.lm_head

    def piece(h, y):
        logits = head(h).float()
        return torch.nn.functional.cross_entropy(
            logits.view(-1, logits.size(-1)), y.view(-1), reduction="sum"
        )

    hidden, targets = hidden[:, :-1], ids[:, 1:]
    total = hidden.new_zeros((), dtype=torch.float32)
    for s in range(0, targets.size(1), chunk):
        h = hidden[:, s : s + chunk]
        total = total + checkpoint(piece, h, targets[:, s : s + chunk], use_reentrant=False)
    return total / targets.numel()


def is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


# ---------------------------------------------------------------------------------------------- parts
def datasheet_tflops(name: str) -> float | None:
    """The datasheet's dense bf16 TFLOP/s of a card torch names `name` (the longest matching key), or None."""
    keys = sorted((k for k in DATASHEET_TFLOPS if k in name), key=len, reverse=True)
    return DATASHEET_TFLOPS[keys[0]] if keys else None


def part_peak(args, sizes: Sizes) -> dict:
    """The card's own bf16 matmul throughput: n x n x n matmuls, warmed up, the median of timed batches."""
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n = sizes.peak_n
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=dev, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    rates = []
    for _ in range(sizes.peak_batches):
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        sync(dev)
        rates.append(10 * 2 * n**3 / (time.perf_counter() - t0) / 1e12)
    name = device_info()["name"]
    return {"n": n, "dtype": str(dtype).split(".")[-1], "bf16_matmul_tflops": round(statistics.median(rates), 1),
            "max_tflops": round(max(rates), 1), "datasheet_tflops": datasheet_tflops(name), "name": name}  # fmt: skip


def part_model(args, sizes: Sizes) -> dict:
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    a = arch(args.reduced)
    model = build_model(a, dev)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    params = sum(p.numel() for p in model.parameters())
    mem = Memory(dev)
    gen = torch.Generator(device="cpu").manual_seed(1)
    out: dict = {"params": params, "layers": a.num_layers, "hidden": a.hidden_size, "dtype": "bfloat16",
                 "head_chunk": sizes.head_chunk, "peak_tflops": args.peak_tflops, "lengths": {}}  # fmt: skip
    t_start = time.monotonic()

    def step(ids, whole_head: bool) -> float:
        sync(dev)
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss if whole_head else None
        if loss is None:
            loss = chunked_loss(model, ids, sizes.head_chunk)
        loss.backward()
        sync(dev)
        dt = time.perf_counter() - t0
        model.zero_grad(set_to_none=True)
        return dt

    warm = torch.randint(0, a.vocab_size, (1, sizes.lengths[0]), generator=gen).to(dev)
    step(warm, whole_head=False)  # kernels compiled and autotuned before any timing
    for n in sizes.lengths:
        row: dict = {}
        out["lengths"][str(n)] = row
        if time.monotonic() - t_start > args.budget_s * 0.45:
            row["skipped"] = "time budget"
            continue
        ids = torch.randint(0, a.vocab_size, (1, n), generator=gen).to(dev)
        try:
            mem.reset()
            times = [step(ids, whole_head=False) for _ in range(sizes.iters)]
            row["peak_gib"] = mem.peak_gib()
        except Exception as exc:
            if not is_oom(exc):
                raise
            row["oom"] = True
            model.zero_grad(set_to_none=True)
            continue
        t = statistics.median(times)
        flops = model_flops(model, a, n)
        row.update(step_s=round(t, 3), tokens_per_s=round(n / t, 1), model_tflop=float(f"{flops / 1e12:.4g}"))
        peak = args.peak_tflops
        row["mfu"] = round(flops / t / (peak * 1e12), 4) if dev == "cuda" and peak else None
        try:
            mem.reset()
            row["whole_head_step_s"] = round(step(ids, whole_head=True), 3)
            whole = mem.peak_gib()
            row["whole_head_peak_gib"] = whole
            if whole and row["peak_gib"] is not None:
                row["logits_share"] = round(max(0.0, whole - row["peak_gib"]) / whole, 3)
        except Exception as exc:
            if not is_oom(exc):
                raise
            row["whole_head_oom"] = True
            model.zero_grad(set_to_none=True)
        # what the whole-sequence logits weigh at least: bf16 logits and their fp32 copy in the loss
        row["logits_gib_bf16_fp32"] = round(n * a.vocab_size * 6 / 2**30, 2)
    return out


def part_logprob(args, sizes: Sizes) -> dict:
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    a = arch(args.reduced)
    model = build_model(a, dev)
    model.eval()
    gen = torch.Generator(device="cpu").manual_seed(2)
    prompt = torch.randint(0, a.vocab_size, (1, sizes.prompt), generator=gen).to(dev)
    with torch.no_grad():  # sharpen: scale the head until the prompt's logits have std `--logit-std`
        spread = model(input_ids=prompt, use_cache=False).logits.float().std().item()
        model.lm_head.weight.mul_(args.logit_std / spread)
    rollout_lp, tokens, entropies = [], [], []
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
        for _ in range(sizes.decode):
            lp = torch.log_softmax(logits.float(), dim=-1)
            tok = torch.multinomial(lp.exp(), 1, generator=None)
            rollout_lp.append(lp.gather(-1, tok).item())
            entropies.append(-(lp.exp() * lp).sum().item())
            tokens.append(tok.item())
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1]
        sync(dev)
        decode_s = time.perf_counter() - t0
        full = torch.cat([prompt, torch.tensor([tokens], device=dev)], dim=1)
        tf = torch.log_softmax(
            model(input_ids=full, use_cache=False).logits[0, sizes.prompt - 1 : -1].float(), -1
        )
        train_lp = tf.gather(-1, torch.tensor(tokens, device=dev)[:, None]).squeeze(-1).tolist()
    delta = sorted(abs(t - r) for t, r in zip(train_lp, rollout_lp, strict=True))
    weights = [math.exp(t - r) for t, r in zip(train_lp, rollout_lp, strict=True)]
    p99 = delta[min(len(delta) - 1, math.ceil(0.99 * len(delta)) - 1)]
    return {
        "prompt_tokens": sizes.prompt, "decoded_tokens": len(tokens), "logit_std": args.logit_std,
        "mean_entropy_nats": round(statistics.mean(entropies), 3),
        "mean_abs_dlogp": round(statistics.mean(delta), 5), "p99_abs_dlogp": round(p99, 5),
        "max_abs_dlogp": round(delta[-1], 5),
        "tis_clip_share_at_2": round(sum(w > 2.0 for w in weights) / len(weights), 4),
        "tis_weight_mean": round(statistics.mean(weights), 4),
        "decode_tokens_per_s": round(len(tokens) / decode_s, 1),
    }  # fmt: skip


def part_grpo(args, sizes: Sizes) -> dict:
    import bench_train

    ns = argparse.Namespace(
        preset=sizes.grpo_preset, steps=2, prompt_tokens=sizes.grpo_prompt, completion_tokens=sizes.grpo_completion,
        tool_tokens=sizes.grpo_tool, prompts=1, samples=sizes.grpo_samples, micro_batch=1, threads=2,
    )  # fmt: skip
    res = bench_train.run_preset(ns)
    keep = ("preset", "params", "steps", "samples_per_step", "prompt_tokens", "completion_tokens", "tool_tokens",
            "rollout_s_per_step", "train_s_per_step", "weight_sync_s_per_step", "step_s", "device")  # fmt: skip
    return {**{k: res.get(k) for k in keep}, "per_step": res["per_step"]}


RUNNERS = {"peak": part_peak, "model": part_model, "logprob": part_logprob, "grpo": part_grpo}


def run_child(args) -> int:
    sizes = REDUCED if args.reduced else FULL
    import torch

    torch.set_num_threads(max(1, min(torch.get_num_threads(), args.threads)))
    t0 = time.monotonic()
    res = RUNNERS[args.child](args, sizes)
    res["wall_s"] = round(time.monotonic() - t0, 1)
    res.update(gdn_paths() if args.child != "grpo" else {})
    print("GPU_CHECK_PART " + json.dumps(res, sort_keys=True), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the JSON file the figures are written to")
    ap.add_argument("--reduced", action="store_true", help="tiny sizes on CPU: the same code, seconds")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the card's bf16 peak for MFU (default: what the peak part measures on this card)")  # fmt: skip
    ap.add_argument("--logit-std", type=float, default=4.0, help="the logprob part's sharpened logit spread")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="the whole check's time budget")
    ap.add_argument("--threads", type=int, default=16, help="torch CPU threads")
    ap.add_argument("--child", choices=PARTS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return run_child(args)
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown part(s) {unknown}; parts are {', '.join(PARTS)}")
    t0 = time.monotonic()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")}  # fmt: skip
    result: dict = {"check": "gpu_check", "reduced": args.reduced, "parts": {}}
    for part in parts:
        left = args.budget_s - (time.monotonic() - t0)
        if left < 20:
            result["parts"][part] = {"skipped": "time budget"}
            continue
        peak = args.peak_tflops or (result["parts"].get("peak") or {}).get("bf16_matmul_tflops")
        result["mfu_against_tflops"] = peak
        cmd = [sys.executable, __file__, str(args.out), "--child", part, "--peak-tflops", str(peak or 0),
               "--logit-std", str(args.logit_std), "--budget-s", str(left), "--threads", str(args.threads)]  # fmt: skip
        cmd += ["--reduced"] if args.reduced else []
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=left + 60)
        except subprocess.TimeoutExpired:
            result["parts"][part] = {"error": f"timed out after {left + 60:.0f} s"}
            continue
        lines = [x for x in proc.stdout.splitlines() if x.startswith("GPU_CHECK_PART ")]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            result["parts"][part] = {"error": f"exit {proc.returncode}: {tail[0][:300]}"}
            sys.stderr.write(proc.stderr[-3000:])
            continue
        result["parts"][part] = json.loads(lines[-1].split(" ", 1)[1])
    probe = subprocess.run(
        [sys.executable, "-c", "import json, sys; sys.path.insert(0, sys.argv[1]); import gpu_check; "
         "print(json.dumps(gpu_check.device_info()))", str(ROOT / "benchmarks")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    result.update(json.loads(probe.stdout) if probe.returncode == 0 else {"device": "unknown"})
    result["wall_s"] = round(time.monotonic() - t0, 1)
    line = json.dumps(result, sort_keys=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(line + "\n", encoding="utf-8")
    tmp.replace(args.out)
    print(line)
    return 0 if all("error" not in v for v in result["parts"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
