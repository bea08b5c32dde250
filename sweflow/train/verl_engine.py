"""The verl engine: a Recipe as verl 0.9.1 Hydra overrides, the Slurm/Ray launch script, verl's checkpoints.

verl runs the production GRPO: its synchronous v1 trainer, a Megatron actor (config `ppo_megatron_trainer`),
vLLM rollout servers and sweflow's agent loop (`verl_agent_loop.SweflowAgentLoop`) that runs every sample
through the dispatcher. verl's metrics become sweflow's in `verl_metrics`.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..schema import default
from .recipe import Recipe
from .tracking import Tracking

# - `verl_overrides(recipe, ...)`: every Recipe knob as a `key=value` override of `verl.trainer.main_ppo`
#   (recipe.verl["overrides"] last; `trainer.use_v1=True`, `v1.trainer_mode=sync`). The agent loop sets each
#   output's `reward_score`, so verl's reward loop never scores (rule-based reward workers exist but are
#   skipped; no reward model).
# - `compose_verl_config(overrides)`: Hydra compose of verl's own config in strict mode (an unknown key
#   raises) plus `validate_config`, the check main_ppo runs first; CPU only, no Ray (~15 s: importing verl).
# - `launch_script(...)`: the bash the train rule runs inside one Slurm allocation (Ray head + workers).
# Deliberate verl behaviours: dual-clip PPO (`clip_ratio_c` 3.0, verl's default) bounds the loss of a
# negative-advantage token whose ratio passes 3; with one update per step the ratio stays near 1.
AGENT_LOOP_NAME = "sweflow_claude_code"
AGENT_LOOP_TARGET = "sweflow.train.verl_agent_loop.SweflowAgentLoop"
CONFIG_NAME = "ppo_megatron_trainer"
# "Per-sample mean": mean over each sample's loss tokens, then over samples.
LOSS_AGG_MODE = "seq-mean-token-mean"
# The recipe's advantages (group normalisation, then batch whitening) as a verl estimator: the module that
# registers it, loaded into every verl process through $VERL_USE_EXTERNAL_MODULES (verl/__init__.py).
WHITEN_ESTIMATOR = "sweflow_grpo_whiten"
WHITEN_MODULE = "sweflow.train.verl_advantage"
_PLAIN = re.compile(r"^[A-Za-z0-9_./@+-]+\Z")


def _hydra_value(value: Any) -> str:
    """A Python value in Hydra's override grammar (strings quoted unless plainly safe)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{value!r} is not a finite number", field="train")
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in ("null", "true", "false"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def verl_overrides(
    recipe: Recipe,
    *,
    train_files: str | Sequence[str],
    val_files: str | Sequence[str],
    model_path: str,
    out_dir: str,
    agent_loop_config: str,
    megatron_ckpt: str | None = None,
    tracking: Tracking | None = None,
) -> list[str]:
    """Hydra overrides for `python -m verl.trainer.main_ppo --config-name ppo_megatron_trainer`.

    Checkpoints go to `<out_dir>/checkpoints` (resumed automatically). `agent_loop_config` is the path of
    the YAML `agent_loop_config_yaml()` returns. `megatron_ckpt`: a converter's torch_dist output to start
    the actor and the reference from (default: the Hugging Face weights at `model_path`, through Megatron-Bridge).
    `tracking`: verl's `trainer.logger` beside its console and file loggers (tensorboard, wandb; their folders
    come from the launch script's environment, `Tracking.env`); None - console and file only.
    """
    r, p, o = recipe, recipe.parallel, recipe.optim
    extra = dict(r.verl or {})
    if r.global_batch % r.samples_per_prompt:
        raise ConfigError(
            f"{r.global_batch} is not a multiple of samples_per_prompt {r.samples_per_prompt}",
            field="train.global_batch",
        )
    rollout_tp = int(extra.get("rollout_tensor_parallel") or p.tensor)
    micro = r.micro_batch
    a, ro, ref = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
    files = lambda f: [f] if isinstance(f, str) else list(f)  # noqa: E731
    kv: list[tuple[str, Any]] = [
        # algorithm: group-normalised GRPO, KL as a loss (never in the reward), token TIS, no rejection
        # group normalisation, then (batch_whiten) whitening over the batch: sweflow's registered estimator
        ("algorithm.adv_estimator", WHITEN_ESTIMATOR if r.batch_whiten else "grpo"),
        ("algorithm.norm_adv_by_std_in_grpo", r.norm_adv_by_std),
        ("algorithm.use_kl_in_reward", False),
        ("algorithm.rollout_correction.rollout_is", "token" if r.tis_level == "token" else None),
        ("algorithm.rollout_correction.rollout_is_threshold", float(r.tis_cap)),
        ("algorithm.rollout_correction.rollout_rs", None),
        ("algorithm.rollout_correction.bypass_mode", False),
        ("critic.enable", False),
        # data: prompts per step; the agent loop renders the conversation itself
        ("data.train_files", files(train_files)),
        ("data.val_files", files(val_files)),
        ("data.train_batch_size", r.prompts_per_step),
        # lengths: a sample's first prompt in the prompt slots, the rest (up to the context window) in the
        # response slots; the agent loop cuts a sample at max_context_tokens, the proxy each call at
        # max_response_tokens (the rollout spec's sampling)
        ("data.max_prompt_length", r.max_prompt_tokens),
        ("data.max_response_length", r.max_context_tokens),
        ("data.seed", r.seed),
        ("actor_rollout_ref.model.path", model_path),
        # actor: one update of global_batch samples per step
        (f"{a}.ppo_mini_batch_size", r.global_batch // r.samples_per_prompt),
        (f"{a}.ppo_epochs", 1),
        (f"{a}.ppo_micro_batch_size_per_gpu", micro),
        (f"{a}.use_kl_loss", r.kl_coef > 0),
        (f"{a}.kl_loss_coef", float(r.kl_coef)),
        (f"{a}.kl_loss_type", r.kl_type),
        (f"{a}.entropy_coeff", float(r.entropy_coef)),
        (f"{a}.clip_ratio", float(r.clip_low)),
        (f"{a}.clip_ratio_low", float(r.clip_low)),
        (f"{a}.clip_ratio_high", float(r.clip_high)),
        (f"{a}.loss_agg_mode", LOSS_AGG_MODE),
        (f"{a}.policy_loss.loss_mode", "vanilla"),
        (f"{a}.optim.lr", float(o.lr)),
        (f"{a}.optim.betas", [float(o.betas[0]), float(o.betas[1])]),
        (f"{a}.optim.weight_decay", float(o.weight_decay)),
        (f"{a}.optim.clip_grad", float(o.grad_clip)),
        (f"{a}.optim.lr_warmup_steps", o.warmup_steps if o.warmup_steps > 0 else -1),
        (f"{a}.optim.lr_decay_style", "constant"),
        (f"{a}.megatron.tensor_model_parallel_size", p.tensor),
        (f"{a}.megatron.context_parallel_size", p.context),
        (f"{a}.megatron.sequence_parallel", p.tensor > 1),
        (f"{a}.megatron.use_mbridge", True),
        (f"{a}.megatron.seed", r.seed),
        # Megatron-Bridge builds the model (verl's default path; `vanilla_mbridge` is deprecated, and mbridge
        # on the index has no Qwen3.5) and loads the Hugging Face weights itself. At context parallelism its
        # provider computes a per-token loss, which verl accepts with padding removal (THD) only; megatron-core
        # 0.19's Gated DeltaNet takes packed sequences with CP (Megatron-LM #2645, #5843).
        ("actor_rollout_ref.model.use_remove_padding", True),
        (f"{a}.megatron.use_remove_padding", True),
        (f"{a}.megatron.vanilla_mbridge", False),
        (f"{ref}.log_prob_micro_batch_size_per_gpu", micro),
        # rollout: vLLM servers driven by sweflow's agent loop; logprobs recorded for TIS
        (f"{ro}.name", "vllm"),
        (f"{ro}.mode", "async"),
        (f"{ro}.n", r.samples_per_prompt),
        (f"{ro}.calculate_log_probs", True),
        (f"{ro}.temperature", float(r.temperature)),
        (f"{ro}.top_p", float(r.top_p)),
        (f"{ro}.top_k", r.top_k if r.top_k > 0 else -1),
        (
            f"{ro}.gpu_memory_utilization",
            float(extra.get("gpu_memory_utilization", default("train.verl.gpu_memory_utilization"))),
        ),
        (f"{ro}.tensor_model_parallel_size", rollout_tp),
        (f"{ro}.max_model_len", r.max_context_tokens),
        (f"{ro}.log_prob_micro_batch_size_per_gpu", micro),
        (f"{ro}.seed", r.seed),
        (f"{ro}.agent.default_agent_loop", AGENT_LOOP_NAME),
        (f"{ro}.agent.agent_loop_config_path", agent_loop_config),
        # reward: the agent loop's reward_score is final (verl's reward loop only scores a None)
        ("reward.reward_model.enable", False),
        ("reward.num_workers", 1),
        # trainer
        ("trainer.project_name", tracking.wandb_project if tracking else "sweflow"),
        ("trainer.experiment_name", r.run),
        ("trainer.nnodes", p.nodes),
        ("trainer.n_gpus_per_node", p.gpus_per_node),
        ("trainer.total_training_steps", r.total_steps),
        # An epoch is at least one step, so this never ends the run before total_training_steps.
        ("trainer.total_epochs", r.total_steps),
        ("trainer.save_freq", r.save_every),
        ("trainer.default_local_dir", str(Path(out_dir) / "checkpoints")),
        ("trainer.resume_mode", "auto"),
        ("trainer.use_v1", True),
        ("trainer.v1.trainer_mode", "sync"),
        ("trainer.logger", tracking.verl_loggers() if tracking else ["console", "file"]),
        ("trainer.val_before_train", False),
        ("trainer.test_freq", -1),
    ]
    kv += _memory_overrides(recipe, micro)
    if megatron_ckpt:
        from ..models.megatron import checkpoint_layout

        # megatron-core loads the folder that holds the shards: a converter's iter_NNNNNNN/, not its root
        megatron_ckpt = checkpoint_layout(megatron_ckpt)["load_path"]
        for section in (a, ref):
            kv.append((f"{section}.megatron.use_dist_checkpointing", True))
            kv.append((f"{section}.megatron.dist_checkpointing_path", megatron_ckpt))
    out = [f"{k}={_hydra_value(v)}" for k, v in kv]
    return out + [str(x) for x in extra.get("overrides") or []]


def _memory_overrides(recipe: Recipe, micro: int) -> list[tuple[str, Any]]:
    """The launcher's memory and throughput settings (`train.verl.memory`) as verl's Megatron knobs.

    full recompute, uniform, n layers -> Megatron's recompute_granularity/method/num_layers (actor); dynamic batch of n tokens per GPU -> use_dynamic_bsz + *_max_token_len_per_gpu (verl
    multiplies by context parallelism); optimizer CPU offload + precision-aware optimizer -> Megatron's
    optimizer_cpu_offload (all of it: fraction 1) with overlap, verl's optim.use_precision_aware_optimizer; log-prob chunks ->
    entropy_from_logits_with_chunking (log-probs already come from vocab-parallel cross-entropy per chunk
    of the sequence, never a full softmax).
    """
    mem = dict((recipe.verl or {}).get("memory") or {})
    a, ref, ro = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout"
    kv: list[tuple[str, Any]] = []
    recompute = mem.get("recompute", "off")
    t = f"{a}.megatron.override_transformer_config"  # the reference only runs forward: nothing to recompute
    if recompute == "full":
        kv += [
            (f"{t}.recompute_granularity", "full"),
            (f"{t}.recompute_method", "uniform"),
            (
                f"{t}.recompute_num_layers",
                int(mem.get("recompute_layers", default("train.verl.memory.recompute_layers"))),
            ),
        ]
    elif recompute == "selective":
        kv += [(f"{t}.recompute_granularity", "selective")]
    per_gpu = mem.get("tokens_per_gpu")
    kv += [(f"{a}.use_dynamic_bsz", bool(per_gpu)), (f"{ref}.log_prob_use_dynamic_bsz", bool(per_gpu))]
    kv += [(f"{ro}.log_prob_use_dynamic_bsz", bool(per_gpu))]
    if per_gpu:
        kv += [
            (f"{a}.ppo_max_token_len_per_gpu", int(per_gpu)),
            (f"{ref}.log_prob_max_token_len_per_gpu", int(per_gpu)),
            (f"{ro}.log_prob_max_token_len_per_gpu", int(per_gpu)),
        ]
    if mem.get("optimizer_offload"):
        o = f"{a}.optim.override_optimizer_config"
        kv += [
            (f"{a}.megatron.optimizer_offload", False),  # verl's own offload moves states between steps
            (f"+{o}.optimizer_cpu_offload", True),
            (f"+{o}.optimizer_offload_fraction", 1.0),
            (f"+{o}.overlap_cpu_optimizer_d2h_h2d", True),
        ]
    # verl's own switch (it also sets the moments' and main grads' dtypes, fp32 here: the recipe's numerics)
    kv += [(f"{a}.optim.use_precision_aware_optimizer", bool(mem.get("precision_aware_optimizer")))]
    if mem.get("logprob_chunk"):
        for section in (a, ref):
            kv += [
                (f"{section}.entropy_from_logits_with_chunking", True),
                (f"{section}.entropy_from_logits_chunk_size", int(mem["logprob_chunk"])),
            ]
    return kv


def agent_loop_config_yaml(name: str = AGENT_LOOP_NAME, target: str = AGENT_LOOP_TARGET) -> str:
    """The YAML list verl reads at `rollout.agent.agent_loop_config_path` to register sweflow's agent loop."""
    return f"- name: {name}\n  _target_: {target}\n"


def verl_config_dir() -> str:
    """The folder of verl's own Hydra configs (verl/trainer/config)."""
    import verl.trainer.config as verl_config

    return str(Path(verl_config.__file__).parent)


def compose_verl_config(overrides: Sequence[str], config_name: str = CONFIG_NAME) -> Any:
    """verl's config composed with `overrides` and checked as main_ppo checks it; returns the DictConfig.

    Raises what verl raises: hydra's ConfigCompositionException for an unknown key or a bad override,
    ValueError/AssertionError from verl's `validate_config` (e.g. an invalid loss_agg_mode). Values
    verl checks only at run time (a misspelt rollout_is) pass here.
    """
    import warnings

    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
        cfg = compose(config_name=config_name, overrides=list(overrides))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        validate_config(
            config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg)
        )
    return cfg


# --------------------------------------------------------------------------- launch

# Ports of one Ray node besides the GCS port: each node that shares a host with another needs its own.
_NODE_PORTS = (
    "node-manager-port",
    "object-manager-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)
_PORT_STRIDE = 20  # node i uses base + i * stride + k for the k-th port above, and its own worker range


def _ray_ports_expr(offset_var: str, base: int) -> str:
    """Bash that expands to the per-node port flags for the node numbered by `$offset_var`."""
    flags = [
        f"--{name}=$(({base} + {offset_var} * {_PORT_STRIDE} + {k}))" for k, name in enumerate(_NODE_PORTS)
    ]
    lo = f"$((20000 + {offset_var} * 1000))"
    hi = f"$((20999 + {offset_var} * 1000))"
    return " ".join(flags + [f"--min-worker-port={lo}", f"--max-worker-port={hi}"])


LAUNCH_TEMPLATE = Path(__file__).with_name("verl_launch.sh")


def fill_launch_template(**values: str) -> str:
    """verl_launch.sh with each @@NAME@@ replaced by `values[NAME]` (every mark filled, no other)."""
    text = LAUNCH_TEMPLATE.read_text(encoding="utf-8")
    marks = set(re.findall(r"@@([A-Z_]+)@@", text))
    if marks != set(values):
        raise ValueError(f"{LAUNCH_TEMPLATE.name}: marks {sorted(marks)} but values for {sorted(values)}")
    for name, value in values.items():
        text = text.replace(f"@@{name}@@", value)
    return text


def launch_script(
    recipe: Recipe,
    overrides: Sequence[str],
    *,
    python: str,
    ray_port: int,
    log_dir: str,
    env: Mapping[str, str] | None = None,
    join_timeout_s: int = 600,
) -> str:
    """The bash that runs verl's trainer inside ONE Slurm allocation of `recipe.parallel.nodes` nodes.

    With $SLURM_JOB_ID: the node list from squeue + scontrol (Snakemake's slurm plugin strips the other
    SLURM_* variables), a Ray head on the first node and a worker on each other one (`srun --overlap`),
    the preflight on the head (sweflow.train.verl_preflight: every node joined within `join_timeout_s`, each
    offers its GPUs and runs a task, the composed trainer config matches; SWEFLOW_VERL_PREFLIGHT_ONLY=1 stops
    there), then main_ppo on the head. Without it
    (one machine) a local head only. Every node gets its own Ray ports, so nodes sharing a host work.
    `env`: non-secret variables exported before Ray starts (Ray workers inherit them: the rollout spec and
    log paths); secrets must already be in the environment. verl's file logger writes
    `<log_dir>/verl_metrics/<attempt>.jsonl` (one file per attempt: the logger truncates its file).
    """
    nodes = recipe.parallel.nodes
    gpus = recipe.parallel.gpus_per_node
    q = shlex.quote
    env = dict(env or {})
    if recipe.batch_whiten:  # every verl process (the driver computes advantages) registers the estimator
        modules = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
        env["VERL_USE_EXTERNAL_MODULES"] = ",".join(dict.fromkeys([*modules, WHITEN_MODULE]))
    exports = "\n".join(f"export {k}={q(str(v))}" for k, v in sorted(env.items()))
    for k in env:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
            raise ConfigError(f"{k!r} is not an environment variable name", field="train.verl")
    args = " \\\n  ".join(q(o) for o in overrides)
    head_ports = _ray_ports_expr("0", ray_port + 1)
    worker_ports = _ray_ports_expr("i", ray_port + 1)
    return fill_launch_template(
        NODES=str(int(nodes)),
        GPUS=str(int(gpus)),
        PYTHON=q(python),
        RAY_PORT=str(int(ray_port)),
        LOG_DIR=q(log_dir),
        EXPORTS=exports,
        HEAD_PORTS=head_ports,
        WORKER_PORTS=worker_ports,
        JOIN_TIMEOUT=str(int(join_timeout_s)),
        ARGS=args,
        CONFIG_NAME=CONFIG_NAME,
    )


# --------------------------------------------------------------------------- checkpoints


def latest_checkpoint_step(checkpoints: str | Path) -> int | None:
    """The step verl's checkpoint manager last saved (`latest_checkpointed_iteration.txt`), None if none."""
    marker = Path(checkpoints) / "latest_checkpointed_iteration.txt"
    try:
        return int(marker.read_text().strip())
    except (OSError, ValueError):
        return None


def merge_command(
    checkpoints: str | Path, step: int, target: str | Path, *, python: str, tie_word_embeddings: bool = False
) -> list[str]:
    """verl's model merger: the actor's Megatron checkpoint of `step` -> a Hugging Face folder at `target`."""
    cmd = [python, "-m", "verl.model_merger", "merge", "--backend", "megatron"]
    cmd += [
        "--local_dir",
        str(Path(checkpoints) / f"global_step_{step}" / "actor"),
        "--target_dir",
        str(target),
    ]
    return cmd + (["--tie-word-embedding"] if tie_word_embeddings else [])
