"""The weights load: the production recipe has Megatron-Bridge convert the Hugging Face weights when the actor
starts (every weight of a tiny Qwen3.5 has a Megatron destination in its bridge), and a converter's torch_dist
output, when a user turns the conversion on, is handed to verl as the folder megatron-core loads.

Both run in `.venv-verl` (the lock's megatron-core 0.19.2 and megatron-bridge 0.6.2; tests/fixtures/
megatron_load_check.py is the child).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERL_PY = ROOT / ".venv-verl" / "bin" / "python"
pytestmark = pytest.mark.slow


def child(mode: str, path: Path) -> dict:
    if not VERL_PY.exists():
        pytest.skip(f"{VERL_PY} is missing: `make .venv-verl/.installed` builds it")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(VERL_PY), str(ROOT / "tests" / "fixtures" / "megatron_load_check.py"), mode, str(path)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_recipe_loads_hugging_face_weights_through_megatron_bridge():
    from sweflow.config import load_config

    cfg = load_config(ROOT / "config" / "swegym-e2b.yaml", ROOT / "tests" / "fixtures" / "site.yaml")
    assert cfg["train"]["model"]["megatron"]["enabled"] is False  # no separate dist checkpoint to go stale


def test_every_weight_of_a_tiny_qwen35_has_a_megatron_destination(tmp_path):
    got = child("mapping", tmp_path / "tiny-qwen3.5")
    assert got["bridge"] == "Qwen35VLBridge" and got["weights"] > 50
    missing = sorted(k for k, v in got["destinations"].items() if v is None)
    assert missing == []
    dest = got["destinations"]
    # the hybrid's two layer kinds and the tied head land where Megatron's Qwen3.5 model has them
    assert dest["model.language_model.layers.0.linear_attn.A_log"].endswith("layers.0.self_attention.A_log")
    assert (
        "layers.3.self_attention.linear_qkv" in dest["model.language_model.layers.3.self_attn.q_proj.weight"]
    )
    assert dest["model.language_model.embed_tokens.weight"].endswith("embedding.word_embeddings.weight")


def test_a_converted_checkpoint_loads_from_the_folder_train_grpo_passes(tmp_path):
    """megatron-core saves in the converter's layout (iter_0000000/ + latest_checkpointed_iteration.txt) and
    loads it back from the path verl's overrides carry; the converter's root (the old hand-over) is refused."""
    pytest.importorskip("verl")
    from omegaconf import OmegaConf

    from sweflow.train.verl_engine import compose_verl_config
    from tests.unit.test_verl_config import overrides_for, production_recipe

    root = tmp_path / "torch_dist"
    got = child("layout", root)
    assert got["equal"] is True and got["load_path"] == str(root / "iter_0000000")
    assert "is not a distributed checkpoint" in got["root_error"]

    import sweflow.train.verl_engine as ve

    overrides = ve.verl_overrides(
        production_recipe(), train_files="/r/t.parquet", val_files="/r/v.parquet", model_path="/m/hf",
        out_dir="/r/out", agent_loop_config="/r/loops.yaml", megatron_ckpt=str(root),
    )  # fmt: skip
    cfg = compose_verl_config(overrides)
    for section in (cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.ref):
        m = OmegaConf.to_container(section.megatron)
        assert m["use_dist_checkpointing"] is True and m["dist_checkpointing_path"] == got["load_path"]
    assert overrides_for  # the same recipe helpers the config tests use
