"""A supervised warm start: fine-tune a model on recorded agent sessions before GRPO.

A random tiny model never solves a task, so GRPO on it never sees reward variance; a warm start on the e2e
check's gold and test-editing sessions gives it groups with reward variance. Only the model's own tokens
(loss mask 1) are trained on, in the window in front of each generated span (see above `receptive_field`).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..schema import default

# A random tiny model never solves a task, so GRPO on it never sees reward variance and its update is a no-op.
# The embedded default first fine-tunes it on the sessions the e2e check records: the gold policy's (resolved,
# reward 1) and the test-editing policy's (the same fix plus a test file, reward 0 by the integrity check).
# The two share every turn but the last, so the warm model solves the task sometimes and cheats sometimes:
# groups with reward variance, and a gradient that learns not to edit tests.

log = logging.getLogger("sweflow.train")


# Only the model's own tokens (loss mask 1) are trained on. For a model whose every layer uses sliding-window
# attention (window W, L layers) a token depends on the last L x W tokens only, so training on the window in
# front of each generated span is exact (RoPE positions are relative) and far cheaper than whole sessions.
def receptive_field(config: Any) -> int | None:
    """Tokens a prediction can see (layers x window) when every layer is sliding-window; None otherwise."""
    from .attention import all_sliding

    return int(config.num_hidden_layers) * int(config.sliding_window) if all_sliding(config) else None


def training_windows(
    samples: Sequence[dict[str, Any]], receptive: int | None
) -> list[tuple[list[int], list[int]]]:
    """(ids, loss mask) pieces to train on: each run of loss tokens with the `receptive` tokens before it,
    or whole samples when `receptive` is None."""
    out: list[tuple[list[int], list[int]]] = []
    for s in samples:
        ids, mask = list(s["token_ids"]), [int(m) for m in s["loss_mask"]]
        if receptive is None:
            out.append((ids, mask))
            continue
        t = 0
        while t < len(mask):
            if not mask[t]:
                t += 1
                continue
            end = t
            while end < len(mask) and mask[end]:
                end += 1
            start = max(0, t - 1 - receptive)  # the logit for token t is computed at position t - 1
            out.append((ids[start:end], [0] * (t - start) + mask[t:end]))
            t = end
    return out


def sft_nll(model: Any, ids: list[int], mask: list[int]) -> Any:
    """Summed negative log-likelihood of the masked tokens of one sequence."""
    import torch

    x = torch.tensor([ids])
    logits = model(input_ids=x).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, x[:, 1:, None])[..., 0]
    m = torch.tensor([mask[1:]], dtype=logp.dtype)
    return -(logp * m).sum()


def warm_start(
    model_dir: str | os.PathLike,
    sessions: Sequence[dict[str, Any]],
    out_dir: str | os.PathLike,
    *,
    steps: int,
    lr: float,
    seed: int = default("train.seed"),
) -> dict[str, Any]:
    """Fine-tune the model at `model_dir` on every sample of `sessions` (e2e trajectory records) for `steps`
    full-batch AdamW steps; save model + tokenizer to `out_dir` (written beside, then renamed). Summary back."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    samples = [s for sess in sessions for s in sess.get("samples") or []]
    if not samples:
        from ..errors import SweflowError

        raise SweflowError("no recorded samples to warm-start on", field="train.warm_start")
    from transformers import AutoConfig

    from .attention import attention_for

    torch.manual_seed(seed)
    attn = attention_for(AutoConfig.from_pretrained(str(model_dir)))
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, **({"attn_implementation": attn} if attn else {})
    )
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model.train()
    receptive = receptive_field(model.config)
    pieces = training_windows(samples, receptive)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    curve: list[float] = []
    t0 = time.monotonic()
    # A mean over all trained tokens, not over windows: where two sessions part (the gold session's short
    # last turn, the test edit's long one) each continuation must weigh the same, or the shorter one wins.
    n_tokens = sum(sum(m[1:]) for _, m in pieces)
    for step in range(steps):
        opt.zero_grad()
        total = 0.0
        for ids, mask in pieces:
            loss = sft_nll(model, ids, mask) / n_tokens
            loss.backward()
            total += float(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        curve.append(round(total, 6))
        if step % 10 == 0 or step == steps - 1:
            log.info("warm start step %d/%d: loss %.5f", step + 1, steps, total)
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return {
        "sessions": [
            {k: s.get(k) for k in ("policy", "instance_id", "reward", "failure_reason")} for s in sessions
        ],
        "samples": len(samples),
        "windows": len(pieces),
        "receptive_field": receptive,
        "trained_tokens": sum(sum(m) for _, m in pieces),
        "window_tokens": sum(len(i) for i, _ in pieces),
        "steps": steps,
        "lr": lr,
        "loss_first": curve[0],
        "loss_last": curve[-1],
        "loss_curve": curve,
        "seconds": round(time.monotonic() - t0, 3),
    }
