"""The GRPO recipe: the `train:` config section as one typed object, and what each engine can do with it.

`Recipe.from_config(cfg)` reads the filled section (schema defaults applied by sweflow.config);
`check_recipe(recipe)` raises one ConfigError line for a combination the chosen engine cannot run
(context parallelism on TRL, say), before any job starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError
from ..schema import default

ENGINES = ("trl", "verl")


@dataclass(frozen=True)
class Optim:
    lr: float = default("train.optim.lr")
    betas: tuple[float, float] = tuple(default("train.optim.betas"))
    weight_decay: float = default("train.optim.weight_decay")
    grad_clip: float = default("train.optim.grad_clip")
    warmup_steps: int = default("train.optim.warmup_steps")


@dataclass(frozen=True)
class Parallel:
    nodes: int = default("train.parallel.nodes")
    gpus_per_node: int = default("train.parallel.gpus_per_node")
    tensor: int = default("train.parallel.tensor")
    context: int = default("train.parallel.context")

    @property
    def world_size(self) -> int:
        """Devices in the job (one per node on CPU)."""
        return self.nodes * max(self.gpus_per_node, 1)


# The engines map a Recipe onto their own configuration (`sweflow.train.trl_engine.grpo_args`,
# `sweflow.train.verl_engine.verl_overrides`).
@dataclass(frozen=True)
class Recipe:
    """Every knob of a synchronous GRPO run, engine-neutral. Sizes are in samples unless named prompts."""

    engine: str = default("train.engine")
    run: str = default("train.run")
    split: str = default("train.split")
    seed: int = default("train.seed")
    shuffle: bool = default("train.shuffle")
    prompts_per_step: int = default("train.prompts_per_step")
    samples_per_prompt: int = default("train.samples_per_prompt")
    global_batch: int = default("train.global_batch")
    micro_batch: int = default("train.micro_batch")
    total_steps: int = default("train.total_steps")
    save_every: int = default("train.save_every")
    optim: Optim = field(default_factory=Optim)
    norm_adv_by_std: bool = default("train.advantage.norm_by_std")
    adv_eps: float = default("train.advantage.eps")
    batch_whiten: bool = default("train.advantage.batch_whiten")
    tis_level: str = default("train.tis.level")  # "token" or "off"
    tis_cap: float = default("train.tis.cap")
    kl_type: str = default("train.kl.type")
    kl_coef: float = default("train.kl.coef")
    kl_in_reward: bool = default("train.kl.in_reward")
    clip_low: float = default("train.clip.low")
    clip_high: float = default("train.clip.high")
    entropy_coef: float = default("train.entropy_coef")
    temperature: float = default("train.sampling.temperature")
    top_p: float = default("train.sampling.top_p")
    top_k: int = default("train.sampling.top_k")
    max_context_tokens: int = default("train.max_context_tokens")  # a call's prompt + max_tokens; one lineage
    max_prompt_tokens: int = default("train.max_prompt_tokens")  # a sample's first prompt
    max_response_tokens: int = default("train.max_response_tokens")  # one model call's output
    parallel: Parallel = field(default_factory=Parallel)
    max_concurrency: int = default("train.rollout.max_concurrency")
    turn_timeout: float | None = default("train.rollout.turn_timeout_sec")
    tampered_reward: float = default("train.reward.tampered")  # a runner_tampered verdict's reward
    verl: Mapping[str, Any] = field(default_factory=dict)

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates per rollout step (1 in the recipe: the whole step is one global batch)."""
        return self.samples_per_step // self.global_batch

    @classmethod
    def from_config(cls, train: Mapping[str, Any]) -> Recipe:
        """From the filled `train:` section (sweflow.config applied the schema defaults)."""
        t = train
        o, p = t["optim"], t["parallel"]
        return cls(
            engine=t["engine"],
            run=t["run"],
            split=t["split"],
            seed=int(t["seed"]),
            shuffle=bool(t["shuffle"]),
            prompts_per_step=int(t["prompts_per_step"]),
            samples_per_prompt=int(t["samples_per_prompt"]),
            global_batch=int(t["global_batch"]),
            micro_batch=int(t["micro_batch"]),
            total_steps=int(t["total_steps"]),
            save_every=int(t["save_every"]),
            optim=Optim(
                lr=float(o["lr"]),
                betas=(float(o["betas"][0]), float(o["betas"][1])),
                weight_decay=float(o["weight_decay"]),
                grad_clip=float(o["grad_clip"]),
                warmup_steps=int(o["warmup_steps"]),
            ),
            norm_adv_by_std=bool(t["advantage"]["norm_by_std"]),
            adv_eps=float(t["advantage"]["eps"]),
            batch_whiten=bool(t["advantage"]["batch_whiten"]),
            tis_level=t["tis"]["level"],
            tis_cap=float(t["tis"]["cap"]),
            kl_type=t["kl"]["type"],
            kl_coef=float(t["kl"]["coef"]),
            kl_in_reward=bool(t["kl"]["in_reward"]),
            clip_low=float(t["clip"]["low"]),
            clip_high=float(t["clip"]["high"]),
            entropy_coef=float(t["entropy_coef"]),
            temperature=float(t["sampling"]["temperature"]),
            top_p=float(t["sampling"]["top_p"]),
            top_k=int(t["sampling"]["top_k"]),
            max_context_tokens=int(t["max_context_tokens"]),
            max_prompt_tokens=int(t["max_prompt_tokens"]),
            max_response_tokens=int(t["max_response_tokens"]),
            parallel=Parallel(
                nodes=int(p["nodes"]),
                gpus_per_node=int(p["gpus_per_node"]),
                tensor=int(p["tensor"]),
                context=int(p["context"]),
            ),
            max_concurrency=int(t["rollout"]["max_concurrency"]),
            turn_timeout=t["rollout"].get("turn_timeout_sec"),
            tampered_reward=float((t.get("reward") or {}).get("tampered", default("train.reward.tampered"))),
            verl=dict(t.get("verl") or {}),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _bad(field_: str, problem: str, hint: str | None = None) -> ConfigError:
    return ConfigError(problem, field=f"train.{field_}", hint=hint)


def check_recipe(r: Recipe) -> None:
    """One ConfigError for the first thing the recipe's engine cannot do; None when it can run."""
    if r.engine not in ENGINES:
        raise _bad("engine", f"{r.engine!r} is not an engine", f"use one of {', '.join(ENGINES)}")
    if r.samples_per_step % r.global_batch:
        raise _bad(
            "global_batch",
            f"{r.global_batch} does not divide prompts_per_step x samples_per_prompt = {r.samples_per_step}",
            "one step's samples must split into whole updates",
        )
    if r.global_batch % r.samples_per_prompt:
        raise _bad(
            "global_batch",
            f"{r.global_batch} is not a multiple of samples_per_prompt {r.samples_per_prompt}",
            "an update must hold whole groups",
        )
    if r.clip_high < r.clip_low:
        raise _bad("clip.high", f"{r.clip_high} is below clip.low {r.clip_low}")
    if r.max_response_tokens >= r.max_context_tokens:
        raise _bad(
            "max_response_tokens",
            f"{r.max_response_tokens} leaves no room for a prompt in max_context_tokens {r.max_context_tokens}",
        )
    if r.max_prompt_tokens >= r.max_context_tokens:
        raise _bad(
            "max_prompt_tokens",
            f"{r.max_prompt_tokens} leaves no room for a response in max_context_tokens {r.max_context_tokens}",
        )
    if r.save_every > r.total_steps:
        raise _bad("save_every", f"{r.save_every} is more than total_steps {r.total_steps}")
    if r.engine == "trl":
        _check_trl(r)
    else:
        _check_verl(r)


def _check_trl(r: Recipe) -> None:
    p = r.parallel
    if p.tensor > 1:
        raise _bad(
            "parallel.tensor",
            f"TRL's GRPOTrainer has no tensor parallelism (tensor {p.tensor})",
            "use engine verl, or tensor 1",
        )
    if p.context > 1:
        raise _bad(
            "parallel.context",
            f"TRL's GRPOTrainer has no context parallelism (context {p.context})",
            "use engine verl, or context 1",
        )
    per_update = r.global_batch
    if per_update % (r.micro_batch * p.world_size):
        raise _bad(
            "micro_batch",
            f"global_batch {per_update} does not split into micro_batch {r.micro_batch} x "
            f"{p.world_size} device(s)",
        )
    per_device = r.samples_per_step // p.world_size
    if r.samples_per_step % p.world_size or per_device % r.micro_batch:
        raise _bad(
            "micro_batch",
            f"a step's {r.samples_per_step} samples do not split evenly over {p.world_size} device(s) "
            f"in micro-batches of {r.micro_batch}",
        )


def _check_verl(r: Recipe) -> None:
    p = r.parallel
    if p.gpus_per_node < 1:
        raise _bad(
            "parallel.gpus_per_node", "the verl engine needs GPUs (gpus_per_node >= 1)", "or use engine trl"
        )
    if (p.tensor * p.context) > p.world_size or p.world_size % (p.tensor * p.context):
        raise _bad(
            "parallel.tensor",
            f"tensor {p.tensor} x context {p.context} does not divide the {p.world_size} GPUs of "
            f"{p.nodes} node(s) x {p.gpus_per_node}",
        )
    if r.adv_eps != 1e-6:
        raise _bad("advantage.eps", f"verl's GRPO estimator uses eps 1e-6, not {r.adv_eps:g}")
    per_gpu = (r.verl.get("memory") or {}).get("tokens_per_gpu")
    if per_gpu and r.max_context_tokens > int(per_gpu) * p.context:
        raise _bad(
            "verl.memory.tokens_per_gpu",
            f"{per_gpu} tokens per GPU x context {p.context} = {int(per_gpu) * p.context} cannot hold one "
            f"sample of max_context_tokens {r.max_context_tokens}",
            "the recipe's context window is tokens_per_gpu x parallel.context",
        )
    dp = p.world_size // (p.tensor * p.context)
    if r.global_batch % dp:
        raise _bad(
            "global_batch",
            f"{r.global_batch} samples do not split over data-parallel size {dp}",
        )
