"""SweflowGRPOTrainer: TRL's GRPOTrainer with sweflow's rollouts, advantages and loss (see trl_engine).

Imported only when a TRL run starts (`trl_engine._trainer_class`), so importing trl_engine stays cheap.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from trl import GRPOTrainer

from ..proxy.engines import TransformersEngine, turn_seed
from ..util import atomic_write
from .algos import LossConfig, group_advantages, grpo_loss, whiten
from .preempt import StopClock
from .recipe import Recipe
from .rollouts import Completion, completion_of, sample_record, step_stats

log = logging.getLogger("sweflow.train")


class LivePolicyEngine(TransformersEngine):
    """TransformersEngine over a model a trainer owns: not moved, not copied; generation under the
    engine's lock with gradients off (the trainer does not step while a rollout generates). With `seed`,
    every turn's sampling is seeded by `turn_seed`."""

    def __init__(self, model: Any, device: str, seed: int | None = None) -> None:
        import torch

        self._torch = torch
        self._bind(model, device)
        self._mode_lock = threading.Lock()
        self.seed = seed

    def generate(self, prompt_ids: list[int], sampling: Any) -> Any:
        # Eval mode while sampling: a model in training mode with gradient checkpointing on drops its KV
        # cache (each token would then see only itself); the trainer sets train mode again when it steps.
        if self.seed is not None and sampling.seed is None:
            sampling = dataclasses.replace(
                sampling, seed=turn_seed(self.seed, sampling.request_id, len(prompt_ids))
            )
        with self._mode_lock:
            was_training = self.model.training
            self.model.eval()
            try:
                return super().generate(prompt_ids, sampling)
            finally:
                self.model.train(was_training)


def _reward_from_rollout(prompts: Any, completions: Any, **kwargs: Any) -> list[float | None]:
    """The fresh evaluation's reward (0.0 for an aborted sample, which has no loss token and advantage 0:
    sweflow's metrics leave it out; only TRL's own logged reward mean counts it)."""
    return list(kwargs["sweflow_reward"])


_reward_from_rollout.__name__ = "fresh_evaluation"


class StopAtBoundary(TrainerCallback):
    """At the end of each rollout step (the last of its `updates_per_step` updates): save and stop when the
    trainer's StopClock says so on any process (sweflow.train.preempt); every process stops at the same step."""

    def __init__(self, trainer: SweflowGRPOTrainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # a resumed run goes on numbering its rollout steps (session ids, their sampling seeds, the
        # rollouts/step-<n>.jsonl files) where the checkpoint left off, as the uninterrupted run does
        self.trainer._generation = int(state.global_step) // self.trainer.recipe.updates_per_step
        self.trainer.stop_clock.start()
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        import torch

        t = self.trainer
        if state.global_step % t.recipe.updates_per_step or state.global_step >= state.max_steps:
            return control
        why = t.stop_clock.boundary(
            last_next=state.max_steps - state.global_step <= t.recipe.updates_per_step
        )
        stop = why is not None
        if t.accelerator.num_processes > 1:
            flag = torch.tensor(float(stop), device=t.accelerator.device)
            stop = float(t.accelerator.reduce(flag, reduction="sum")) > 0
        if stop:
            t.stopped_for = why or "another process was told to stop"
            log.warning("saving checkpoint-%d and stopping: %s", state.global_step, t.stopped_for)
            control.should_save = True
            control.should_training_stop = True
        return control


class SweflowGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose rollouts, advantages and loss are sweflow's (see the module docstring)."""

    def __init__(
        self,
        *args: Any,
        recipe: Recipe,
        rollouts_factory: Callable[[Any], Any],
        out_dir: str | os.PathLike,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, reward_funcs=[_reward_from_rollout], rollout_func=self._rollout, **kwargs)
        self.recipe = recipe
        self.loss_cfg = LossConfig.from_recipe(recipe)
        self.out_dir = Path(out_dir)
        self._rows: list[dict] = []
        self._valid: list[bool] = []
        self._rewards: list[float] = []
        self._extras: list[list] = []  # per local sample: the earlier lineages of its session
        self._generation = 0
        self._loss_stats: list[dict[str, float]] = []
        self._step_rollout: dict[str, Any] = {}
        self._t_rollout_end = time.monotonic()
        self.metrics_writer: Any = None  # sweflow.train.tracking.MetricsWriter, set by train_trl
        device = str(self.accelerator.device)
        self.policy_engine = LivePolicyEngine(
            self.accelerator.unwrap_model(self.model),
            device,
            seed=recipe.seed + self.accelerator.process_index,
        )
        self.rollouts = rollouts_factory(self.policy_engine)
        # Slurm's time limit: save and stop at a step boundary before it (sweflow.train.preempt)
        self.stop_clock = StopClock()
        self.stopped_for: str | None = None
        self.add_callback(StopAtBoundary(self))

    # ---------------------------------------------------------------- task order
    def _get_train_sampler(self, dataset: Any = None) -> Any:
        """TRL's RepeatSampler, whose shuffle draws one permutation per epoch from a generator seeded once; a
        resumed run makes a new one, so it would visit the tasks in epoch 1's order again. Its first pass
        here first draws the permutations of the epochs the checkpoint completed: the uninterrupted order."""
        sampler = super()._get_train_sampler(dataset)
        if not getattr(sampler, "shuffle", False) or getattr(sampler, "generator", None) is None:
            return sampler
        trainer = self

        class ResumedOrder(type(sampler)):  # type: ignore[misc]
            _caught_up = False

            def __iter__(self):  # noqa: ANN204
                import torch

                if not self._caught_up:
                    self._caught_up = True
                    for _ in range(int(trainer.state.epoch or 0)):
                        torch.randperm(self.num_samples, generator=self.generator)
                return super().__iter__()

        sampler.__class__ = ResumedOrder
        return sampler

    # ---------------------------------------------------------------- rollouts
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._rows = [json.loads(x["sweflow_row"]) for x in inputs]
        out = super()._generate_and_score_completions(inputs)
        return self._sweflow_advantages(out)

    def _rollout(self, prompts: list, trainer: Any) -> dict[str, list]:
        import torch
        from accelerate.utils import gather_object

        n = self.recipe.samples_per_prompt
        offset = self.accelerator.process_index * len(prompts)
        step = self._generation + 1
        jobs = [(row, (offset + i) % n) for i, row in enumerate(self._rows)]
        t0 = time.monotonic()
        t_sync = time.monotonic()  # the live policy is the trainer's model: nothing to copy
        sync_s = time.monotonic() - t_sync
        results = self.rollouts.run(jobs, prefix=f"{self.recipe.run}.s{step}.")
        rollout_s = time.monotonic() - t0
        pad = self.processing_class.pad_token_id
        comps: list[Completion] = [
            completion_of(r, max_context_tokens=self.recipe.max_context_tokens, pad_id=pad) for r in results
        ]
        self._valid = [c.valid for c in comps]
        self._extras = [list(c.extras) if c.valid else [] for c in comps]
        self._rewards = [float(r.reward) if c.valid else 0.0 for r, c in zip(results, comps, strict=True)]
        records = [
            sample_record(r, step=step, group=(offset + i) // n, completion=c)
            for i, (r, c) in enumerate(zip(results, comps, strict=True))
        ]
        records = gather_object(records)
        if self.accelerator.is_main_process:
            self._write_records(step, records)
        stats = step_stats(records)
        stats.update(rollout_s=round(rollout_s, 3), weight_sync_s=round(sync_s, 6))
        stats["trained_samples"] = sum(1 for r in records if r.get("trained"))
        stats["trained_lineages"] = sum(int(r.get("trained_lineages", 0)) for r in records)
        self._step_rollout = stats
        self._generation = step
        self._t_rollout_end = time.monotonic()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        return {
            "prompt_ids": [c.prompt_ids for c in comps],
            "completion_ids": [c.completion_ids for c in comps],
            "logprobs": [c.logprobs for c in comps],
            "env_mask": [c.env_mask for c in comps],
            "sweflow_reward": [
                float(r.reward) if c.valid else None for r, c in zip(results, comps, strict=True)
            ],
        }

    def _write_records(self, step: int, records: Sequence[dict]) -> None:
        folder = self.out_dir / "rollouts"
        folder.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
        atomic_write(folder / f"step-{step}.jsonl", text)

    def _sweflow_advantages(self, out: dict[str, Any]) -> dict[str, Any]:
        import torch

        device = out["completion_mask"].device
        n = self.recipe.samples_per_prompt
        valid_local = torch.tensor(self._valid, dtype=torch.bool, device=device)
        rewards_local = torch.tensor(self._rewards, dtype=torch.float32, device=device)
        valid = self.accelerator.gather(valid_local).tolist()
        rewards = self.accelerator.gather(rewards_local).tolist()
        adv = group_advantages(
            rewards,
            [i // n for i in range(len(rewards))],
            valid,
            norm_by_std=self.recipe.norm_adv_by_std,
            eps=self.recipe.adv_eps,
        )
        start = self.accelerator.process_index * len(self._valid)
        local = torch.tensor(adv[start : start + len(self._valid)], dtype=torch.float32, device=device)
        extras = self._extras if len(self._extras) == len(self._valid) else [[] for _ in self._valid]
        out["completion_mask"] = out["completion_mask"] * valid_local.unsqueeze(1).to(
            out["completion_mask"].dtype
        )
        # every trained lineage weighs as one sample (aborted samples 0): dropping a sample does not
        # shrink the update, and a session split in k lineages counts k rows, as in verl's batch
        n_extra = float(
            self.accelerator.reduce(
                torch.tensor(float(sum(map(len, extras))), device=device), reduction="sum"
            )
        )
        scale = len(valid) / max(1.0, sum(valid) + n_extra)
        out["sweflow_sample_weight"] = valid_local.to(torch.float32) * scale
        extra_adv = [[float(local[i])] * len(xs) for i, xs in enumerate(extras)]
        if self.recipe.batch_whiten:
            mask = out["completion_mask"] * out.get("tool_mask", torch.ones_like(out["completion_mask"]))
            counts = [sum(x.env_mask) for xs in extras for x in xs]
            flat_adv = [a for row in extra_adv for a in row]
            tail = torch.tensor(
                [a for a, c in zip(flat_adv, counts, strict=True) for _ in range(c)],
                dtype=torch.float32,
                device=device,
            )
            # statistics of the whole step: every process's loss tokens, of every lineage (a sum over
            # processes); an earlier lineage's tokens carry its session's advantage
            white = whiten(
                torch.cat([local.unsqueeze(1).expand(mask.shape).reshape(-1), tail]),
                torch.cat([mask.reshape(-1).to(torch.float32), torch.ones_like(tail)]),
                all_reduce=lambda t: self.accelerator.reduce(t, reduction="sum"),
            )
            local = white[: mask.numel()].view(mask.shape)
            firsts, at = [], mask.numel()
            for c in counts:
                firsts.append(float(white[at]))
                at += c
            it = iter(firsts)
            extra_adv = [[next(it) for _ in row] for row in extra_adv]
        out["advantages"] = local
        out["sweflow_extra"] = [
            [self._lineage_inputs(x, a, scale, out) for x, a in zip(xs, advs, strict=True)]
            for xs, advs in zip(extras, extra_adv, strict=True)
        ]
        return out

    def _lineage_logps(self, model: Any, x: Any) -> list[float]:
        import torch

        ids = torch.tensor([x.prompt_ids + x.completion_ids], device=self.accelerator.device)
        with torch.no_grad():
            logp, _, _ = self._get_per_token_logps_and_entropies(
                model, ids, torch.ones_like(ids), len(x.completion_ids)
            )
        return logp[0].tolist()

    def _lineage_inputs(self, x: Any, advantage: float, weight: float, out: dict[str, Any]) -> dict:
        """What the loss needs of an earlier lineage, taken now as TRL takes its completions' (the
        policy's logprobs where TRL keeps old ones, the reference model's where the KL term is on)."""
        old = self._lineage_logps(self.model, x) if out.get("old_per_token_logps") is not None else None
        ref = None
        if self.beta != 0.0:
            if self.ref_model is None:
                raise RuntimeError("the KL term needs a reference model for every lineage")
            ref = self._lineage_logps(self.ref_model, x)
        return {
            "ids": x.prompt_ids + x.completion_ids,
            "keep": len(x.completion_ids),
            "env_mask": x.env_mask,
            "rollout": x.logprobs,
            "old": old,
            "ref": ref,
            "advantage": advantage,
            "weight": weight,
        }

    # ---------------------------------------------------------------- loss
    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        import torch

        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        logp, entropy, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
        )
        old = inputs.get("old_per_token_logps")
        old = logp.detach() if old is None else old
        loss, stats = grpo_loss(
            logp,
            old,
            inputs["advantages"],
            mask,
            self.loss_cfg,
            rollout_logp=inputs.get("sampling_per_token_logps"),
            ref_logp=inputs.get("ref_per_token_logps"),
            entropy=entropy,
            sample_weight=inputs.get("sweflow_sample_weight"),
        )
        self._loss_stats.append(stats)
        rows = completion_ids.size(0)
        for x in (x for xs in inputs.get("sweflow_extra") or () for x in xs):
            extra, extra_stats = self._lineage_loss(model, x)
            loss = loss + extra / rows  # one more row of the micro-batch's per-sample mean
            self._loss_stats.append(extra_stats)
        if self.model.training:
            loss = loss / self.current_gradient_accumulation_steps
        return loss

    def _lineage_loss(self, model: Any, x: dict) -> tuple[Any, dict[str, float]]:
        import torch

        dev = self.accelerator.device
        ids = torch.tensor([x["ids"]], device=dev)
        logp, entropy, _ = self._get_per_token_logps_and_entropies(
            model, ids, torch.ones_like(ids), x["keep"], compute_entropy=True
        )

        def row(values: list) -> Any:
            return torch.tensor([values], dtype=logp.dtype, device=dev)

        return grpo_loss(
            logp,
            logp.detach() if x["old"] is None else row(x["old"]),
            torch.full_like(logp, x["advantage"]),
            row(x["env_mask"]),
            self.loss_cfg,
            rollout_logp=row(x["rollout"]),
            ref_logp=None if x["ref"] is None else row(x["ref"]),
            entropy=entropy,
            sample_weight=torch.tensor([x["weight"]], device=dev),
        )

    # ---------------------------------------------------------------- checkpoints
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        from .resume import write_checkpoint_marker

        t0 = time.monotonic()
        super()._save_checkpoint(model, trial)
        # every process has written its part (RNG states, shards) before the marker says the folder is whole
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            folder = (
                Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            write_checkpoint_marker(folder, int(self.state.global_step))
        self.stop_clock.saved(time.monotonic() - t0)

    # ---------------------------------------------------------------- metrics
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        super().log(logs, start_time)
        if "loss" not in logs and "grad_norm" not in logs:
            return
        self._write_metrics(logs)

    def _write_metrics(self, logs: dict[str, float]) -> None:
        keys = ("policy_loss", "kl", "clip_fraction", "tis_weight_mean", "tis_clipped_share", "entropy")
        loss_means = {
            k: (
                sum(s[k] for s in self._loss_stats if k in s)
                / max(1, sum(1 for s in self._loss_stats if k in s))
            )
            if any(k in s for s in self._loss_stats)
            else None
            for k in keys
        }
        self._loss_stats = []
        train_s = time.monotonic() - self._t_rollout_end
        roll = dict(self._step_rollout)
        tokens = (roll.get("prompt_tokens") or 0) + (roll.get("response_tokens") or 0)
        total_s = (roll.get("rollout_s") or 0.0) + train_s
        line = {
            "step": int(self.state.global_step),
            "rollout_step": self._generation,
            **roll,
            **loss_means,
            "grad_norm": logs.get("grad_norm"),
            "lr": logs.get("learning_rate"),
            "train_s": round(train_s, 3),
            "tokens_per_s": round(tokens / total_s, 2) if total_s > 0 else None,
        }
        if self.accelerator.is_main_process:
            with open(self.out_dir / "metrics.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, sort_keys=True) + "\n")
            if self.metrics_writer is not None:  # TensorBoard / W&B: the same names as verl's (tracking)
                self.metrics_writer.write(line)
        log.info(
            "step %d: reward %.3f over %d/%d samples, %d group(s) with gradient, %d tamper verdict(s), loss %s",
            line["step"],
            line.get("reward_mean") or 0.0,
            line.get("completed", 0),
            line.get("samples", 0),
            line.get("groups_with_gradient", 0),
            line.get("tampered", 0),
            line.get("policy_loss"),
        )
        self._t_rollout_end = time.monotonic()
