"""The Megatron actor's config built exactly as verl 0.9.1 builds it, on CPU: `MegatronEngine`'s own
`_init_device_mesh` and `_build_tf_config` on `world` gloo ranks, from a Hugging Face model folder and the
composed config's `actor_rollout_ref.actor.megatron` section. Run in the production env's Python (3.12):
`python -m sweflow.models.verl_build SPEC.json OUT.json`; tests/unit/test_megatron_qwen35.py drives it.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys
import traceback
import types
from pathlib import Path
from typing import Any

# What each rank reports of the built config (the provider's on Megatron-Bridge, mbridge's TransformerConfig).
REPORTED = (
    "tensor_model_parallel_size", "context_parallel_size", "sequence_parallel", "num_layers", "hidden_size",
    "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "experimental_attention_variant",
    "linear_attention_freq", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "recompute_granularity", "recompute_method", "recompute_num_layers",
    "recompute_modules", "attention_backend", "calculate_per_token_loss", "variable_seq_lengths", "bf16",
    "params_dtype", "rotary_percent", "attention_output_gate", "share_embeddings_and_output_weights",
)  # fmt: skip


def _plain(value: Any) -> Any:
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def _rank(rank: int, spec: dict[str, Any], out: str) -> None:
    """One rank: torch.distributed as verl's worker sets it up, then the engine's two build steps."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(spec["world"]), LOCAL_RANK=str(rank))
    res: dict[str, Any] = {"rank": rank}
    try:
        if spec.get("preload"):  # a CPU stand-in the env cannot install here (tests: Transformer Engine)
            importlib.import_module(spec["preload"])
        import torch.distributed as dist
        from omegaconf import OmegaConf
        from transformers import AutoConfig
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.engine.megatron.transformer_impl import MegatronEngine

        dist.init_process_group("gloo", rank=rank, world_size=spec["world"])
        engine_config = omega_conf_to_dataclass(OmegaConf.create(spec["megatron"]))
        hf = spec["hf_dir"]
        model_config = types.SimpleNamespace(
            hf_config=AutoConfig.from_pretrained(hf), local_path=hf, trust_remote_code=False,
            model_type="language_model", share_embeddings_and_output_weights=bool(spec.get("tie_embeddings")),
            mtp=types.SimpleNamespace(enable=False),
        )  # fmt: skip
        engine = object.__new__(MegatronEngine)  # __init__ also builds optimizers; these are its first steps
        engine.model_config, engine.engine_config = model_config, engine_config
        engine.enable_routing_replay, engine._qat_enabled = False, False
        engine._init_device_mesh()
        engine._build_tf_config()
        built = engine.tf_config if engine.tf_config is not None else engine.provider
        res.update(
            ok=True, type=type(built).__name__, config={k: _plain(getattr(built, k, None)) for k in REPORTED}
        )
    except BaseException as exc:  # noqa: BLE001 - reported per rank
        res.update(
            ok=False, error=f"{type(exc).__name__}: {exc}"[:800], traceback=traceback.format_exc()[-3000:]
        )
    Path(f"{out}.rank{rank}").write_text(json.dumps(res, sort_keys=True), encoding="utf-8")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build(spec: dict[str, Any], out: str | os.PathLike) -> list[dict[str, Any]]:
    """Every rank's report for `spec` {hf_dir, megatron (the composed section), world, preload?}."""
    import torch.multiprocessing as mp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(_free_port())
    mp.spawn(_rank, args=(spec, str(out)), nprocs=int(spec["world"]), join=True)
    reports = []
    for r in range(int(spec["world"])):
        part = Path(f"{out}.rank{r}")
        reports.append(json.loads(part.read_text(encoding="utf-8")))
        part.unlink()
    return reports


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m sweflow.models.verl_build SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    reports = build(spec, args[1])
    tmp = Path(args[1] + ".tmp")
    tmp.write_text(json.dumps(reports, sort_keys=True, indent=1), encoding="utf-8")
    tmp.replace(args[1])
    bad = [r for r in reports if not r.get("ok")]
    for r in bad[:1]:
        print(f"rank {r['rank']}: {r['error']}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
