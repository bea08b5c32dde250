"""Qwen/Qwen3.5-4B as megatron-core configures it, at the recipe's TP 2 x CP 4 with sequence parallelism.

A hybrid of Gated DeltaNet (GDN) and full attention layers (see above `Qwen35Arch`); megatron-core
versions differ in GDN context parallelism (`gdn_cp_problem`). All of it runs on CPU, no torch.distributed.
Run `python -m sweflow.models.megatron_qwen35` in the GPU environment to check its megatron-core.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .hub import ModelError
from .megatron import GPU_ENV

# Everything here runs on CPU and needs no torch.distributed: the config's own validation is where the CP
# refusal lives, and the cp_comm_type contract is checked by binding the keywords to GatedDeltaNet's signature
# (building the layer itself needs CUDA, Transformer Engine and flash-linear-attention).

# Context parallelism is where megatron-core versions differ (see `gdn_cp_problem`):
# - up to 0.17.x, `TransformerConfig.__post_init__` refuses GDN with `context_parallel_size > 1` ("Gated delta
#   net does not support context parallel for now");
# - 0.18.x has GDN CP (NVIDIA/Megatron-LM#2642), but `GatedDeltaNet.__init__` does not take the `cp_comm_type`
#   keyword that `TransformerLayer` passes whenever CP > 1 and `cp_comm_type` is set, so building the layer
#   raises TypeError (#4374 proposed the fix and was closed; it landed with #5843);
# - 0.19.0 has both.
#
# The first megatron-core release with GDN context parallelism, and the first whose GatedDeltaNet also takes
# TransformerLayer's cp_comm_type keyword (git: core_v0.18.0 holds #2642; #5843 first in core_v0.19.0).
GDN_CP_SINCE = (0, 18, 0)
GDN_CP_COMM_TYPE_SINCE = (0, 19, 0)


# The production model is a hybrid: three Gated DeltaNet (GDN, linear attention) layers then one gated full
# attention layer, eight times. megatron-core describes that with one `TransformerConfig`:
# `experimental_attention_variant="gated_delta_net"` plus `linear_attention_freq=4` (layer i, 0-based, is full
# attention when (i + 1) % 4 == 0, else GDN) and the `linear_*` GDN sizes. That is what Megatron-Bridge's
# Qwen3.5 providers and mbridge's Qwen3.5 bridge build from the Hugging Face config, and what verl's Megatron
# actor trains.
@dataclass(frozen=True)
class Qwen35Arch:
    """The text model's published sizes (Qwen/Qwen3.5-4B; transformers' Qwen3_5TextConfig defaults differ)."""

    num_layers: int = 32
    hidden_size: int = 2560
    ffn_hidden_size: int = 9216
    num_attention_heads: int = 16
    num_query_groups: int = 4
    head_dim: int = 256
    vocab_size: int = 248320
    full_attention_interval: int = 4
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6
    # rotary settings are GPTModel arguments in megatron-core, not TransformerConfig fields
    rope_theta: float = 1e7
    partial_rotary_factor: float = 0.25


QWEN35_4B = Qwen35Arch()


def layer_kinds(arch: Qwen35Arch = QWEN35_4B) -> list[str]:
    """Per layer, "gdn" or "attention", by megatron-core's rule for an integer `linear_attention_freq`."""
    return [
        "attention" if (i + 1) % arch.full_attention_interval == 0 else "gdn" for i in range(arch.num_layers)
    ]


def hf_text_config(arch: Qwen35Arch = QWEN35_4B, **overrides: Any) -> Any:
    """transformers' `Qwen3_5TextConfig` of `arch` (the trainer-side model of the GPU check; random weights).

    Rotary: `partial_rotary_factor` of the head, split over the multimodal sections in the published
    11:11:10 proportion (text positions fill all three alike).
    """
    from transformers import Qwen3_5TextConfig

    half = int(arch.head_dim * arch.partial_rotary_factor) // 2
    mrope = [round(half * 11 / 32), round(half * 11 / 32)]
    mrope.append(half - sum(mrope))
    kwargs: dict[str, Any] = {
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.ffn_hidden_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_query_groups,
        "head_dim": arch.head_dim,
        "linear_conv_kernel_dim": arch.linear_conv_kernel_dim,
        "linear_key_head_dim": arch.linear_key_head_dim,
        "linear_value_head_dim": arch.linear_value_head_dim,
        "linear_num_key_heads": arch.linear_num_key_heads,
        "linear_num_value_heads": arch.linear_num_value_heads,
        "layer_types": [
            {"gdn": "linear_attention", "attention": "full_attention"}[k] for k in layer_kinds(arch)
        ],
        "rms_norm_eps": arch.rms_norm_eps,
        "max_position_embeddings": 262144,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": arch.rope_theta,
            "partial_rotary_factor": arch.partial_rotary_factor,
            "mrope_section": mrope,
            "mrope_interleaved": True,
        },
        "use_cache": False,
    }
    return Qwen3_5TextConfig(**{**kwargs, **overrides})


def save_hf_config(folder: str | os.PathLike, arch: Qwen35Arch = QWEN35_4B) -> Path:
    """`config.json` of the published model's shape (`Qwen3_5ForConditionalGeneration`, the text model
    `hf_text_config(arch)`, tied embeddings): what the bridges read from Qwen/Qwen3.5-4B's folder."""
    from transformers import Qwen3_5Config

    text = hf_text_config(arch, tie_word_embeddings=True).to_dict()
    text["full_attention_interval"] = arch.full_attention_interval  # mbridge reads it beside layer_types
    config = Qwen3_5Config(text_config=text, tie_word_embeddings=True)
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    config.save_pretrained(folder)
    return Path(folder) / "config.json"


def transformer_config_kwargs(
    arch: Qwen35Arch = QWEN35_4B,
    *,
    tp: int = 2,
    cp: int = 4,
    sequence_parallel: bool = True,
    cp_comm_type: str | None = None,
) -> dict[str, Any]:
    """The `TransformerConfig(**kwargs)` of the model at `tp` x `cp` (bf16, the recipe's full recompute).

    `cp_comm_type` stays None as in verl's Megatron-Bridge path; Megatron-LM's training arguments default to "p2p".
    """
    import torch
    import torch.nn.functional as F

    return {
        "num_layers": arch.num_layers,
        "hidden_size": arch.hidden_size,
        "ffn_hidden_size": arch.ffn_hidden_size,
        "num_attention_heads": arch.num_attention_heads,
        "num_query_groups": arch.num_query_groups,
        "kv_channels": arch.head_dim,
        # RMSNorm with a zero-centred weight (Qwen's "1 + w"), SwiGLU, no bias anywhere
        "normalization": "RMSNorm",
        "layernorm_epsilon": arch.rms_norm_eps,
        "layernorm_zero_centered_gamma": True,
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "add_bias_linear": False,
        "add_qkv_bias": False,
        # full-attention layers: QK layernorm and a sigmoid gate on the attention output
        "qk_layernorm": True,
        "attention_output_gate": True,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        # the hybrid: GDN everywhere but every full_attention_interval-th layer
        "experimental_attention_variant": "gated_delta_net",
        "linear_attention_freq": arch.full_attention_interval,
        "linear_conv_kernel_dim": arch.linear_conv_kernel_dim,
        "linear_key_head_dim": arch.linear_key_head_dim,
        "linear_value_head_dim": arch.linear_value_head_dim,
        "linear_num_key_heads": arch.linear_num_key_heads,
        "linear_num_value_heads": arch.linear_num_value_heads,
        "tensor_model_parallel_size": tp,
        "context_parallel_size": cp,
        "sequence_parallel": sequence_parallel,
        "cp_comm_type": cp_comm_type,
        "bf16": True,
        "params_dtype": torch.bfloat16,
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
    }


def qwen35_transformer_config(
    tp: int = 2,
    cp: int = 4,
    *,
    sequence_parallel: bool = True,
    cp_comm_type: str | None = None,
    arch: Qwen35Arch = QWEN35_4B,
) -> Any:
    """The installed megatron-core's `TransformerConfig` for the model; its own validation runs here.

    Raises what megatron-core raises (AssertionError/ValueError naming the offending field, e.g. GDN with CP on
    megatron-core < 0.18), or ModelError when megatron-core is not importable.
    """
    try:
        from megatron.core.transformer.transformer_config import TransformerConfig
    except ImportError as exc:
        raise ModelError(
            f"megatron-core is not importable ({exc}); it is in the GPU environment {GPU_ENV}",
            field="train.model.megatron",
        ) from exc
    return TransformerConfig(
        **transformer_config_kwargs(
            arch, tp=tp, cp=cp, sequence_parallel=sequence_parallel, cp_comm_type=cp_comm_type
        )
    )


def gdn_layer_kwargs_problem(config: Any) -> str | None:
    """None when GatedDeltaNet accepts what TransformerLayer passes it for `config`, else the TypeError.

    TransformerLayer (megatron/core/transformer/transformer_layer.py) adds `cp_comm_type` to the self-attention
    module's keywords whenever `context_parallel_size > 1` and `config.cp_comm_type` is set.
    """
    from megatron.core.ssm.gated_delta_net import GatedDeltaNet

    kwargs: dict[str, Any] = {"layer_number": 1, "pg_collection": None}
    if config.context_parallel_size > 1 and config.cp_comm_type is not None:
        comm = config.cp_comm_type
        kwargs["cp_comm_type"] = comm[0] if isinstance(comm, list) else comm
    try:
        inspect.signature(GatedDeltaNet).bind(config, None, **kwargs)
    except TypeError as exc:
        return f"GatedDeltaNet.__init__() rejects TransformerLayer's keywords {sorted(kwargs)}: {exc}"
    return None


def version_tuple(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a version string such as "0.19.0" or "0.18.0rc3"."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if not m:
        raise ValueError(f"not a version: {version!r}")
    return int(m[1]), int(m[2]), int(m[3] or 0)


def gdn_cp_problem(version: str) -> str | None:
    """None when megatron-core `version` trains GDN layers with context parallelism, else why not."""
    v = version_tuple(version)
    if v < GDN_CP_SINCE:
        return (
            f"megatron-core {version} refuses Gated DeltaNet with context parallelism "
            "(GDN CP arrived in 0.18.0, NVIDIA/Megatron-LM#2642)"
        )
    if v < GDN_CP_COMM_TYPE_SINCE:
        return (
            f"megatron-core {version}: GatedDeltaNet does not take the cp_comm_type TransformerLayer passes at "
            "CP > 1, a TypeError whenever cp_comm_type is set (fixed in 0.19.0)"
        )
    return None


def qwen35_config_report(
    tp: int, cp: int, *, sequence_parallel: bool = True, cp_comm_type: str | None = None
) -> dict[str, Any]:
    """Build the config with the installed megatron-core and report it (what the entry point prints)."""
    config = qwen35_transformer_config(tp, cp, sequence_parallel=sequence_parallel, cp_comm_type=cp_comm_type)
    from megatron.core import package_info

    kinds = layer_kinds()
    return {
        # megatron-core appends the short git hash of whatever work tree it is installed in ("+abc1234")
        "megatron_core": package_info.__version__.split("+")[0],
        "tensor_model_parallel_size": config.tensor_model_parallel_size,
        "context_parallel_size": config.context_parallel_size,
        "sequence_parallel": config.sequence_parallel,
        "cp_comm_type": config.cp_comm_type,
        "experimental_attention_variant": config.experimental_attention_variant,
        "layers": {"gdn": kinds.count("gdn"), "attention": kinds.count("attention")},
        "gdn_layer_kwargs_problem": gdn_layer_kwargs_problem(config),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sweflow.models.megatron_qwen35", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--cp", type=int, default=4)
    parser.add_argument("--no-sequence-parallel", action="store_true")
    parser.add_argument("--cp-comm-type", default=None, help='e.g. "p2p" (Megatron-LM\'s training default)')
    args = parser.parse_args(argv)
    try:
        report = qwen35_config_report(
            args.tp, args.cp, sequence_parallel=not args.no_sequence_parallel, cp_comm_type=args.cp_comm_type
        )
    except ModelError as exc:
        print(f"sweflow: {exc}", file=sys.stderr)
        return 2
    except (AssertionError, ValueError, TypeError) as exc:
        print(
            f"sweflow: megatron-core rejects the Qwen3.5-4B config: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return 1
    print(json.dumps(report, sort_keys=True))
    return 1 if report["gdn_layer_kwargs_problem"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
