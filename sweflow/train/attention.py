"""Blockwise sliding-window attention for the tiny models' long sessions on CPU.

`blockwise_attention` runs SDPA on query blocks against only the keys their window can reach: O(n x window)
instead of O(n^2). Registered with transformers as "sweflow_blockwise" (SDPA's mask);
`attention_for(config)` names it for a model whose every layer is sliding-window, else None.
"""

from __future__ import annotations

from typing import Any

NAME = "sweflow_blockwise"
BLOCK = 256


# With sliding-window attention, SDPA gets an explicit mask and computes every query against every key: O(n^2)
# for a 6k-token Claude Code session, most of it masked out. `blockwise_attention` runs SDPA on query blocks
# against only the keys their window can reach (plus the mask's own slice, so padding and the window stay
# exact): O(n x window).
def blockwise_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """SDPA over query blocks and the keys in reach of each (B, H, Q, D) layout in, (B, Q, H, D) out."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    window = sliding_window or getattr(module, "sliding_window", None)
    q_len, k_len = query.shape[2], key.shape[2]
    if not window or q_len <= BLOCK or attention_mask is None or attention_mask.dim() != 4:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    offset = k_len - q_len  # keys already in the cache
    outs = []
    for q0 in range(0, q_len, BLOCK):
        q1 = min(q_len, q0 + BLOCK)
        k0, k1 = max(0, offset + q0 - window), offset + q1
        out, _ = sdpa_attention_forward(
            module,
            query[:, :, q0:q1],
            key[:, :, k0:k1],
            value[:, :, k0:k1],
            attention_mask[:, :, q0:q1, k0:k1],
            dropout=dropout,
            scaling=scaling,
            is_causal=False,
            **kwargs,
        )
        outs.append(out)
    return torch.cat(outs, dim=1), None


def register() -> str:
    """Make "sweflow_blockwise" a transformers attention implementation (idempotent); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, blockwise_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME


def all_sliding(config: Any) -> bool:
    """Whether every layer of the model uses sliding-window attention."""
    types = getattr(config, "layer_types", None) or []
    return bool(
        getattr(config, "sliding_window", None) and types and all(t == "sliding_attention" for t in types)
    )


def attention_for(config: Any) -> str | None:
    """The blockwise implementation (registered) for an all-sliding-window model, else None (keep the default)."""
    return register() if all_sliding(config) else None
