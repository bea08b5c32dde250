"""Qwen3.5-4B's Megatron actor built the way verl builds it: verl 0.9.1's own `MegatronEngine` steps
(`_init_device_mesh`, `_build_tf_config`) on 8 gloo ranks at the recipe's TP 2 x CP 4 with sequence
parallelism, from a folder with the published model's config.json and the composed
`actor_rollout_ref.actor.megatron` section of config/swegym-e2b.yaml (`sweflow.models.verl_build`).

It runs in the production env's Python with the lock's packages: `make test` builds `.venv-verl` (Python
3.12, torch, megatron-core 0.19.2, verl, transformers, hydra and what they need at the lock's versions, then
megatron-bridge --no-deps as stage 2 does). Transformer Engine's torch extension has no wheel (nvcc), so a
CPU stand-in lets megatron.bridge's LoRA module import (tests/fixtures/cpu_te_stub.py); nothing in the build
calls it. Without `.venv-verl` the build tests skip, saying how to make it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sweflow.envlock import read_pins
from sweflow.models.megatron_qwen35 import (
    QWEN35_4B,
    gdn_cp_problem,
    layer_kinds,
    save_hf_config,
    transformer_config_kwargs,
    version_tuple,
)

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "envs" / "train-verl.lock.txt"
VERL_PY = ROOT / ".venv-verl" / "bin" / "python"
MBRIDGE_INDEX = ROOT / ".venv-verl" / "mbridge-index"  # mbridge as the index has it (0.15.1), --target


def test_the_hybrid_is_24_gdn_and_8_full_attention_layers_where_transformers_puts_them():
    kinds = layer_kinds()
    assert (kinds.count("gdn"), kinds.count("attention")) == (24, 8)
    assert [i for i, k in enumerate(kinds) if k == "attention"] == [3, 7, 11, 15, 19, 23, 27, 31]
    qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.configuration_qwen3_5")
    hf = qwen3_5.Qwen3_5TextConfig(num_hidden_layers=32, full_attention_interval=4)
    assert [{"linear_attention": "gdn", "full_attention": "attention"}[t] for t in hf.layer_types] == kinds


def test_the_gpu_checks_transformers_model_is_the_same_architecture_as_megatrons():
    pytest.importorskip("transformers.models.qwen3_5")
    from sweflow.models.megatron_qwen35 import QWEN35_4B, hf_text_config

    hf, mc = hf_text_config(), transformer_config_kwargs(tp=1, cp=1)
    assert [
        {"linear_attention": "gdn", "full_attention": "attention"}[t] for t in hf.layer_types
    ] == layer_kinds()
    pairs = {"hidden_size": "hidden_size", "intermediate_size": "ffn_hidden_size",
             "num_hidden_layers": "num_layers", "num_attention_heads": "num_attention_heads",
             "num_key_value_heads": "num_query_groups", "head_dim": "kv_channels",
             "linear_key_head_dim": "linear_key_head_dim", "linear_value_head_dim": "linear_value_head_dim",
             "linear_num_key_heads": "linear_num_key_heads", "linear_num_value_heads": "linear_num_value_heads",
             "linear_conv_kernel_dim": "linear_conv_kernel_dim", "rms_norm_eps": "layernorm_epsilon"}  # fmt: skip
    assert {h: getattr(hf, h) for h in pairs} == {h: mc[m] for h, m in pairs.items()}
    assert hf.vocab_size == QWEN35_4B.vocab_size == 248320
    rope = hf.rope_parameters
    assert rope["rope_theta"] == 1e7 and rope["partial_rotary_factor"] == 0.25
    assert rope["mrope_section"] == [11, 11, 10]  # 32 = a quarter of the 256-dim head, in pairs


def test_the_config_carries_the_published_sizes_and_splits_over_tp_times_cp():
    kw = transformer_config_kwargs(tp=2, cp=4)
    assert (kw["num_layers"], kw["hidden_size"], kw["ffn_hidden_size"]) == (32, 2560, 9216)
    assert (kw["num_attention_heads"], kw["num_query_groups"], kw["kv_channels"]) == (16, 4, 256)
    assert (kw["linear_num_key_heads"], kw["linear_num_value_heads"]) == (16, 32)
    assert (kw["linear_key_head_dim"], kw["linear_value_head_dim"], kw["linear_conv_kernel_dim"]) == (
        128,
        128,
        4,
    )
    assert kw["experimental_attention_variant"] == "gated_delta_net" and kw["linear_attention_freq"] == 4
    assert kw["qk_layernorm"] and kw["attention_output_gate"] and kw["gated_linear_unit"]
    assert not kw["add_bias_linear"] and not kw["add_qkv_bias"]
    assert (kw["tensor_model_parallel_size"], kw["context_parallel_size"], kw["sequence_parallel"]) == (
        2,
        4,
        True,
    )
    # GDN context parallelism moves heads across the CP group: every TP x CP rank needs whole GDN heads
    assert QWEN35_4B.linear_num_key_heads % (2 * 4) == 0 and QWEN35_4B.linear_num_value_heads % (2 * 4) == 0


def test_only_megatron_core_0_19_and_later_trains_gdn_with_context_parallelism():
    assert "refuses Gated DeltaNet with context parallelism" in gdn_cp_problem("0.16.1")
    assert "refuses" in gdn_cp_problem("0.17.1")
    assert "cp_comm_type" in gdn_cp_problem("0.18.2")
    assert gdn_cp_problem("0.19.0") is None and gdn_cp_problem("0.20.0rc1") is None
    assert version_tuple("0.18.0rc3") == (0, 18, 0)


def test_the_lock_pins_a_megatron_core_that_trains_gdn_with_context_parallelism():
    pins = read_pins(LOCK)
    assert gdn_cp_problem(str(pins["megatron-core"])) is None, pins["megatron-core"]


def composed_megatron(**recipe_changes) -> dict:
    """The production recipe's composed `actor_rollout_ref.actor.megatron` section (sweflow's overrides)."""
    pytest.importorskip("verl")
    from sweflow.train.verl_engine import compose_verl_config
    from tests.unit.test_verl_config import overrides_for, production_recipe

    cfg = compose_verl_config(overrides_for(production_recipe(**recipe_changes)))
    assert cfg.actor_rollout_ref.model.use_remove_padding is True
    return OmegaConf.to_container(cfg.actor_rollout_ref.actor.megatron, resolve=True)


def verl_build(tmp_path: Path, megatron: dict, *, pythonpath: str = "") -> tuple[int, list[dict], str]:
    if not VERL_PY.exists():
        pytest.skip(f"{VERL_PY} is missing: `make {VERL_PY.parent.parent.name}/.installed` builds it")
    hf = tmp_path / "Qwen3.5-4B"
    save_hf_config(hf)
    spec = {"hf_dir": str(hf), "megatron": megatron, "world": 8, "tie_embeddings": True}
    spec["preload"] = "tests.fixtures.cpu_te_stub"
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, str(ROOT)) if p)}
    env.update(PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [str(VERL_PY), "-m", "sweflow.models.verl_build", str(tmp_path / "spec.json"), str(out)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    reports = json.loads(out.read_text()) if out.exists() else []
    return proc.returncode, reports, proc.stderr[-3000:]


@pytest.mark.slow
def test_verls_own_build_makes_qwen35_at_tp2_cp4_with_the_pinned_megatron(tmp_path):
    megatron = composed_megatron()
    assert megatron["use_mbridge"] and not megatron["vanilla_mbridge"] and megatron["use_remove_padding"]
    rc, reports, err = verl_build(tmp_path, megatron)
    assert rc == 0 and len(reports) == 8 and all(r["ok"] for r in reports), err
    assert {r["type"] for r in reports} == {"Qwen35VLModelProvider"}  # Megatron-Bridge's own provider
    c = reports[0]["config"]
    assert (c["tensor_model_parallel_size"], c["context_parallel_size"], c["sequence_parallel"]) == (
        2,
        4,
        True,
    )
    assert (c["num_layers"], c["hidden_size"], c["ffn_hidden_size"]) == (32, 2560, 9216)
    assert (c["num_attention_heads"], c["num_query_groups"], c["kv_channels"]) == (16, 4, 256)
    assert (c["linear_num_key_heads"], c["linear_num_value_heads"]) == (16, 32)
    assert c["experimental_attention_variant"] == "gated_delta_net"
    assert c["linear_attention_freq"] == [0 if k == "attention" else 1 for k in layer_kinds()]
    # the composed override_transformer_config reached the model: the recipe's full uniform recompute
    assert (c["recompute_granularity"], c["recompute_method"], c["recompute_num_layers"]) == (
        "full",
        "uniform",
        1,
    )
    # Megatron-Bridge's per-token loss at CP > 1 is what verl accepts only with padding removal (on above)
    assert c["calculate_per_token_loss"] is True and c["bf16"] is True
    assert c["rotary_percent"] == QWEN35_4B.partial_rotary_factor and c["share_embeddings_and_output_weights"]


@pytest.mark.slow
def test_the_stop_41_build_path_fails(tmp_path):
    """What the check catches: the old overrides (vanilla mbridge, no padding removal) with the mbridge the
    index has (0.15.1, no Qwen3.5) cannot build the model. mbridge's git pin of stop 41 (641a5a01), which CI
    cannot fetch, fails the same call with megatron-core 0.19.2 on `async_tensor_model_parallel_allreduce`
    (measured by hand, 2026-12-07)."""
    if not (MBRIDGE_INDEX / "mbridge").exists():
        pytest.skip(f"{MBRIDGE_INDEX} is missing (the Makefile's .venv-verl target installs it)")
    megatron = {**composed_megatron(), "vanilla_mbridge": True, "use_remove_padding": False}
    rc, reports, err = verl_build(tmp_path, megatron, pythonpath=str(MBRIDGE_INDEX))
    assert rc != 0 and reports and not any(r["ok"] for r in reports), err
    assert "qwen3_5" in reports[0]["error"].lower() or "unregistered" in reports[0]["error"].lower(), reports[
        0
    ]
