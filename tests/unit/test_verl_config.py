"""The verl engine's overrides compose and validate against verl 0.9.1's own Hydra config (CPU, no Ray)."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("verl")

from hydra.errors import ConfigCompositionException, InstantiationException  # noqa: E402

from sweflow.config import load_config  # noqa: E402
from sweflow.errors import ConfigError  # noqa: E402
from sweflow.train.recipe import Parallel, Recipe, check_recipe  # noqa: E402
from sweflow.train.verl_engine import (  # noqa: E402
    AGENT_LOOP_NAME,
    WHITEN_ESTIMATOR,
    agent_loop_config_yaml,
    compose_verl_config,
    launch_script,
    verl_overrides,
)

RECIPE = Path(__file__).resolve().parents[2] / "config" / "swegym-e2b.yaml"
SITE = RECIPE.parents[1] / "tests" / "fixtures" / "site.yaml"  # the proxy URL a site sets


def production_recipe(**kw) -> Recipe:
    """The production recipe as config/swegym-e2b.yaml states it (schema defaults filled), `kw` replaced."""
    return dataclasses.replace(Recipe.from_config(load_config(RECIPE, SITE)["train"]), **kw)


def overrides_for(recipe: Recipe, tmp: str = "/runs/x") -> list[str]:
    return verl_overrides(
        recipe,
        train_files=f"{tmp}/train.parquet",
        val_files=f"{tmp}/val.parquet",
        model_path="/models/Qwen--Qwen3.5-4B/hf",
        out_dir=f"{tmp}/out",
        agent_loop_config=f"{tmp}/agent_loops.yaml",
    )


@pytest.fixture(scope="module")
def composed():
    recipe = production_recipe()
    check_recipe(recipe)
    return compose_verl_config(overrides_for(recipe))


def test_production_overrides_compose_and_carry_the_recipe(composed):
    """The composed verl config of config/swegym-e2b.yaml carries the launcher's settings (REFERENCE
    "Training defaults"), not verl's defaults."""
    c = composed
    alg, actor, rollout = c.algorithm, c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout
    ref = c.actor_rollout_ref.ref
    # group normalisation then whitening over the batch: sweflow's estimator in verl's registry
    assert alg.adv_estimator == WHITEN_ESTIMATOR and alg.norm_adv_by_std_in_grpo is True
    assert alg.use_kl_in_reward is False
    rc = alg.rollout_correction
    assert (rc.rollout_is, rc.rollout_is_threshold, rc.rollout_rs, rc.bypass_mode) == (
        "token",
        2.0,
        None,
        False,
    )
    assert c.data.train_batch_size == 8 and rollout.n == 16
    assert actor.ppo_mini_batch_size * rollout.n == 128  # one update per step of 128 samples
    assert actor.ppo_epochs == 1 and actor.ppo_micro_batch_size_per_gpu == 1
    assert actor.use_kl_loss is True and actor.kl_loss_coef == 0.001 and actor.kl_loss_type == "low_var_kl"
    assert actor.entropy_coeff == 0.0
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
    assert actor.loss_agg_mode == "seq-mean-token-mean" and actor.policy_loss.loss_mode == "vanilla"
    o = actor.optim
    assert (o.lr, list(o.betas), o.weight_decay, o.clip_grad) == (1e-6, [0.9, 0.98], 0.1, 1.0)
    assert o.lr_decay_style == "constant" and o.lr_warmup_steps == -1
    m = actor.megatron
    assert (m.tensor_model_parallel_size, m.context_parallel_size) == (2, 4)
    assert m.sequence_parallel is True and m.use_mbridge is True
    assert ref.megatron.context_parallel_size == 4  # the reference follows the actor
    # Megatron-Bridge's provider (verl's default path) with padding removal, which its per-token loss at
    # CP > 1 needs (test_megatron_qwen35.py builds it the way verl does); the HF weights load through it
    assert c.actor_rollout_ref.model.use_remove_padding is True and m.use_remove_padding is True
    assert m.vanilla_mbridge is False and m.use_dist_checkpointing is False
    # lengths: context 16,384 x CP 4 = 65,536 (vLLM's max_model_len; the response slots hold a whole
    # sample after its first prompt), 16,000 per call (the rollout spec's sampling, not verl's)
    assert rollout.max_model_len == 65536 == actor.ppo_max_token_len_per_gpu * m.context_parallel_size
    assert rollout.prompt_length == 32768 and rollout.response_length == 65536
    # memory: full recompute (uniform, 1 layer), dynamic batch of 16,384 tokens per GPU, optimizer CPU
    # offload with the precision-aware optimizer, log-prob/entropy chunks of 1,024
    t = m.override_transformer_config
    assert (t.recompute_granularity, t.recompute_method, t.recompute_num_layers) == ("full", "uniform", 1)
    assert actor.use_dynamic_bsz is True and actor.ppo_max_token_len_per_gpu == 16384
    assert ref.log_prob_use_dynamic_bsz is True and ref.log_prob_max_token_len_per_gpu == 16384
    assert rollout.log_prob_use_dynamic_bsz is True and rollout.log_prob_max_token_len_per_gpu == 16384
    assert dict(o.override_optimizer_config) == {
        "optimizer_cpu_offload": True,
        "optimizer_offload_fraction": 1.0,
        "overlap_cpu_optimizer_d2h_h2d": True,
    }
    assert o.use_precision_aware_optimizer is True and m.optimizer_offload is False
    assert actor.entropy_from_logits_with_chunking is True and actor.entropy_from_logits_chunk_size == 1024
    assert ref.entropy_from_logits_chunk_size == 1024
    assert (rollout.name, rollout.mode, rollout.calculate_log_probs) == ("vllm", "async", True)
    assert (rollout.temperature, rollout.top_p, rollout.top_k) == (1.0, 1.0, -1)
    assert rollout.gpu_memory_utilization == 0.6 and rollout.tensor_model_parallel_size == 2
    assert rollout.agent.default_agent_loop == AGENT_LOOP_NAME
    assert rollout.agent.agent_loop_config_path == "/runs/x/agent_loops.yaml"
    assert c.reward.reward_model.enable is False
    t = c.trainer
    assert (t.nnodes, t.n_gpus_per_node, t.total_training_steps, t.save_freq) == (4, 8, 500, 10)
    assert t.default_local_dir == "/runs/x/out/checkpoints" and t.resume_mode == "auto"
    assert t.use_v1 is True and t.v1.trainer_mode == "sync"
    assert "file" in list(t.logger)
    assert c.actor_rollout_ref.model.path == "/models/Qwen--Qwen3.5-4B/hf"
    assert list(c.data.train_files) == ["/runs/x/train.parquet"]


def test_group_only_advantages_stay_available_as_verls_grpo():
    c = compose_verl_config(overrides_for(production_recipe(batch_whiten=False)))
    assert c.algorithm.adv_estimator == "grpo"


def test_memory_settings_can_be_turned_off():
    recipe = production_recipe(verl={"memory": {"recompute": "off", "tokens_per_gpu": None}})
    c = compose_verl_config(overrides_for(recipe))
    actor = c.actor_rollout_ref.actor
    assert (
        actor.use_dynamic_bsz is False
        and actor.megatron.override_transformer_config.recompute_granularity is None
    )
    assert actor.optim.use_precision_aware_optimizer is False


def test_a_context_window_over_tokens_per_gpu_x_cp_is_refused():
    recipe = production_recipe(max_context_tokens=65537)
    with pytest.raises(ConfigError, match="train.verl.memory.tokens_per_gpu"):
        check_recipe(recipe)


def test_removed_keys_are_not_emitted():
    text = "\n".join(overrides_for(production_recipe()))
    for gone in ("tis_imp_ratio_cap", "algorithm.rollout_is=", "rollout_is_level", "rollout.agent.name"):
        assert gone not in text


def test_tis_off_disables_importance_weights():
    c = compose_verl_config(overrides_for(production_recipe(tis_level="off")))
    assert c.algorithm.rollout_correction.rollout_is is None


def test_an_unknown_key_is_rejected_by_hydra_strict_mode():
    recipe = production_recipe(verl={"overrides": ["actor_rollout_ref.actor.tis_imp_ratio_cap=2.0"]})
    with pytest.raises(ConfigCompositionException):
        compose_verl_config(overrides_for(recipe))


def test_a_bad_value_of_a_known_key_is_caught_by_verls_validation():
    recipe = production_recipe(verl={"overrides": ["actor_rollout_ref.actor.loss_agg_mode=per-sample"]})
    # verl's ActorConfig rejects it while validate_config builds the dataclass (hydra wraps the ValueError).
    with pytest.raises(InstantiationException, match="Invalid loss_agg_mode: per-sample"):
        compose_verl_config(overrides_for(recipe))


def test_a_batch_that_does_not_split_over_data_parallel_ranks_is_caught():
    # 3 x 16 = 48 samples over data-parallel 32 / (2 x 4) = 4 ranks is fine; 3 x 5 = 15 is not.
    # (with fixed micro-batches: a dynamic batch packs by tokens, and verl checks this one then)
    base = production_recipe()
    fixed = {**base.verl, "memory": {**base.verl["memory"], "tokens_per_gpu": None}}
    recipe = production_recipe(prompts_per_step=3, samples_per_prompt=5, global_batch=15, verl=fixed)
    with pytest.raises(AssertionError, match="divisible"):
        compose_verl_config(overrides_for(recipe))


def test_extra_overrides_come_last_and_win():
    recipe = production_recipe(verl={"overrides": ["actor_rollout_ref.rollout.gpu_memory_utilization=0.8"]})
    out = overrides_for(recipe)
    assert out[-1] == "actor_rollout_ref.rollout.gpu_memory_utilization=0.8"


def test_agent_loop_yaml_registers_the_sweflow_loop(tmp_path):
    from omegaconf import OmegaConf

    path = tmp_path / "agent_loops.yaml"
    path.write_text(agent_loop_config_yaml())
    loops = OmegaConf.load(path)
    assert [(x.name, x._target_) for x in loops] == [
        ("sweflow_claude_code", "sweflow.train.verl_agent_loop.SweflowAgentLoop")
    ]


def test_launch_script_for_four_nodes_starts_ray_on_each_and_parses(tmp_path):
    recipe = production_recipe()
    overrides = overrides_for(recipe) + ["trainer.experiment_name='it''s spaced'"]
    script = launch_script(
        recipe,
        overrides,
        python="/opt/env/bin/python",
        ray_port=6379,
        log_dir=str(tmp_path / "logs"),
        env={"SWEFLOW_ROLLOUT_SPEC": str(tmp_path / "spec.json")},
    )
    assert 'squeue -h -j "$SLURM_JOB_ID" -o %N' in script and "scontrol show hostnames" in script
    assert "mapfile -t NODES" in script and "NNODES=4" in script
    assert 'srun -N1 -n1 --overlap -w "$HEAD" $RAY start --head' in script
    assert script.count("--disable-usage-stats --block") == 3 and script.count("2>&1 &\n") == 3
    assert '$RAY start --address="$HEAD_IP:$PORT"' in script and "for ((i = 1; i < NNODES; i++))" in script
    assert (
        "trap cleanup EXIT" in script
        and "-m verl.trainer.main_ppo --config-name ppo_megatron_trainer" in script
    )
    assert "--node-manager-port=$((6380 + i * 20 + 0))" in script  # per-node ports: nodes may share a host
    # the preflight on the head checks the cluster and the composed config before the trainer starts
    pre = script.index("-m sweflow.train.verl_preflight --nodes")
    assert pre < script.index("-m verl.trainer.main_ppo") and "--gpus-per-node 8" in script[pre:]
    assert "SWEFLOW_VERL_PREFLIGHT_ONLY:-0" in script
    assert "'trainer.experiment_name='\"'\"'it'\"'\"''\"'\"'s spaced'\"'\"''" in script  # shell-quoted
    path = tmp_path / "launch.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True).returncode == 0


def test_the_preflight_names_every_way_the_cluster_differs_from_the_config():
    from omegaconf import OmegaConf

    from sweflow.train.verl_preflight import cluster_problems as check

    cfg = compose_verl_config(overrides_for(production_recipe(parallel=Parallel(nodes=2, gpus_per_node=8))))
    nodes = [{"NodeID": f"{i:040x}", "NodeManagerAddress": f"10.0.0.{i}", "Resources": {"GPU": 8.0}}
             for i in (1, 2)]  # fmt: skip
    probes = [{"node_id": n["NodeID"], "hostname": "h"} for n in nodes]
    assert check(nodes, probes, cfg, want_nodes=2, gpus_per_node=8) == []
    short = [dict(nodes[0]), {**nodes[1], "Resources": {"GPU": 4.0}}]
    problems = check(short[:1] + short[1:], probes[:1], cfg, want_nodes=2, gpus_per_node=8)
    assert any("offers 4 GPU(s)" in p for p in problems)
    assert any("probe tasks ran on 1 of 2" in p for p in problems)
    other = OmegaConf.merge(cfg, {"trainer": {"nnodes": 4}})
    assert any(
        "asks for 4 node(s) x 8" in p for p in check(nodes, probes, other, want_nodes=2, gpus_per_node=8)
    )
    assert any("1 ray node(s) are alive" in p for p in check(nodes[:1], probes[:1], cfg, want_nodes=2,
                                                              gpus_per_node=8))  # fmt: skip
