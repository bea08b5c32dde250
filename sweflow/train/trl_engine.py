"""The TRL engine: TRL 1.16's GRPOTrainer with sweflow's rollouts and the recipe's loss.

`grpo_args(recipe, ...)` maps the Recipe onto a GRPOConfig; the proxy's engine is the trainer's live
policy; `SweflowGRPOTrainer` overrides the rollout function, the advantages and the loss (each is noted
above the code it concerns). Each optimizer step appends one line to metrics.jsonl.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..util import atomic_write, replace_folder
from .recipe import Recipe
from .tracking import MetricsWriter, Tracking, tracking_env

log = logging.getLogger("sweflow.train")


# `grpo_args(recipe, ...)` maps the Recipe onto a GRPOConfig (one generation per step of prompts x n samples,
# `updates_per_step` optimizer updates of `global_batch` samples, micro-batches of `micro_batch`).
def grpo_args(
    recipe: Recipe, output_dir: str | os.PathLike, *, world_size: int = 1, report_to: Sequence[str] = ()
) -> Any:
    """The GRPOConfig that runs `recipe` (`world_size` = processes, one per device; `report_to`: the
    Trainer's loggers, `Tracking.report_to()`)."""
    from trl import GRPOConfig

    r = recipe
    per_update = r.global_batch // (r.micro_batch * world_size)
    per_generation = r.samples_per_step // (r.micro_batch * world_size)
    on_cpu = r.parallel.gpus_per_node == 0
    return GRPOConfig(
        output_dir=str(output_dir),
        seed=r.seed,
        num_generations=r.samples_per_prompt,
        per_device_train_batch_size=r.micro_batch,
        gradient_accumulation_steps=per_update,
        steps_per_generation=per_generation,
        num_iterations=1,
        max_steps=r.total_steps * r.updates_per_step,
        max_completion_length=r.max_context_tokens - 1,  # a sample after its first prompt token
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        learning_rate=r.optim.lr,
        adam_beta1=r.optim.betas[0],
        adam_beta2=r.optim.betas[1],
        weight_decay=r.optim.weight_decay,
        max_grad_norm=r.optim.grad_clip,
        warmup_steps=r.optim.warmup_steps,
        lr_scheduler_type="constant_with_warmup" if r.optim.warmup_steps else "constant",
        beta=r.kl_coef,  # TRL computes the reference logprobs only when beta != 0
        epsilon=r.clip_low,
        epsilon_high=r.clip_high,
        loss_type="grpo",
        scale_rewards="group",
        use_bias_correction_kl=False,
        mask_truncated_completions=False,
        remove_unused_columns=False,
        shuffle_dataset=r.shuffle,
        save_strategy="steps",
        save_steps=r.save_every * r.updates_per_step,
        save_only_model=False,
        logging_steps=1,
        report_to=list(report_to),
        disable_tqdm=True,
        use_cpu=on_cpu,
        bf16=not on_cpu,
        dataloader_num_workers=0,
        log_completions=False,
        gradient_checkpointing=False,
    )


# `SweflowGRPOTrainer` overrides three things: the rollout function (sweflow's Dispatcher; each session's
# final lineage is TRL's completion, the earlier lineages of a split session ride along and are trained too,
# see `sweflow.train.rollouts.completion_of`), the advantages (`sweflow.train.algos.group_advantages` over
# valid samples only, every lineage of a session with the session's; aborted samples lose every loss token;
# every lineage weighs as one sample, as a row of verl's batch does), and the loss
# (`sweflow.train.algos.grpo_loss`: PPO clip with the high side, token TIS on the recorded rollout logprobs,
# clamped k3 KL to the reference model, per-sample mean). TRL's own loss would weigh its KL by the ratio, skip
# the clamp and, without vLLM, ignore the rollout logprobs (REFERENCE "TRL 1.16").
def _trainer_class() -> type:
    """SweflowGRPOTrainer (sweflow.train.trl_trainer, imported here so that importing this module does not
    import TRL)."""
    from .trl_trainer import SweflowGRPOTrainer

    return SweflowGRPOTrainer


def state_sha256(model: Any) -> str:
    """sha256 over a model's state dict (names, dtypes, shapes, bytes) in name order."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def trim_metrics(path: Path, last_step: int) -> None:
    """Keep the metrics lines of steps up to `last_step` (a resumed run rewrites the rest)."""
    if not path.exists():
        return
    keep = [
        ln
        for ln in path.read_text(encoding="utf-8").splitlines()
        if ln.strip() and json.loads(ln)["step"] <= last_step
    ]
    atomic_write(path, "".join(ln + "\n" for ln in keep))


# The proxy's engine is the trainer's live policy (`LivePolicyEngine` over the unwrapped model): every step
# samples from the current weights, so there is nothing to sync (weight_sync_s is the no-op's time).
#
# Each optimizer step appends one line to metrics.jsonl; each generation writes rollouts/step-<n>.jsonl.
def train_trl(
    recipe: Recipe,
    *,
    rows: Sequence[dict[str, Any]],
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    rollouts_factory: Callable[[Any], Any],
    tracking: Tracking | None = None,
    tracking_dir: str | os.PathLike | None = None,
    attach: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the GRPO run in `out_dir`: checkpoints/, final/, metrics.jsonl, rollouts/.

    `rollouts_factory(engine)` returns a `PolicyRollouts`-like context manager (`.run(jobs, prefix)`) over
    the live policy engine; it is entered for the whole run. `tracking`: where metrics go besides
    metrics.jsonl, under `tracking_dir` (the run's folder; default `out_dir`), with `attach` (the run's
    config and dataset shas) written once. Returns a summary.
    """
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    out = Path(out_dir)
    ckpt_dir = out / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    from .resume import last_complete_checkpoint

    found = last_complete_checkpoint(ckpt_dir)
    last = str(found) if found else None
    resumed_from = None
    max_steps = recipe.total_steps * recipe.updates_per_step
    if found:
        state = json.loads((found / "trainer_state.json").read_text())
        resumed_from = int(state["global_step"])
        trim_metrics(out / "metrics.jsonl", resumed_from)
        if resumed_from >= max_steps:
            log.info("the run is complete (%s, update %d of %d) and made from the same inputs: reusing its "
                     "final weights", found.name, resumed_from, max_steps)  # fmt: skip
        else:
            log.info("resuming from %s (update %d of %d)", found.name, resumed_from, max_steps)
    else:
        (out / "metrics.jsonl").unlink(missing_ok=True)
        log.info("starting at update 0 of %d", max_steps)
    tracking = (tracking or Tracking(tensorboard=False)).checked()
    track_dir = Path(tracking_dir) if tracking_dir is not None else out
    if not found and int(os.environ.get("RANK", "0")) == 0:
        shutil.rmtree(track_dir / "tensorboard", ignore_errors=True)  # a run started over: its old curves go
    data = Dataset.from_list(
        [{"prompt": r["prompt"], "sweflow_row": json.dumps(r, sort_keys=True)} for r in rows]
    )
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    # torchrun sets WORLD_SIZE for a data-parallel run (sweflow.train.launch); one process otherwise
    args = grpo_args(
        recipe, ckpt_dir, world_size=int(os.environ.get("WORLD_SIZE", "1")), report_to=tracking.report_to()
    )
    args.run_name = recipe.run
    from transformers import AutoConfig

    from .attention import attention_for

    args.model_init_kwargs = {"dtype": torch.float32 if args.use_cpu else torch.bfloat16}
    attn = attention_for(AutoConfig.from_pretrained(str(model_dir)))
    if attn:  # an all-sliding-window model: attention over each query block's window only
        args.model_init_kwargs["attn_implementation"] = attn
    # the Trainer's own loggers read their folders from the environment (TENSORBOARD_LOGGING_DIR, WANDB_*)
    with tracking_env(tracking.env(track_dir, "trl")):
        trainer = _trainer_class()(
            model=str(model_dir),
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            recipe=recipe,
            rollouts_factory=rollouts_factory,
            out_dir=out,
        )
        t0 = time.monotonic()
        with trainer.rollouts, contextlib.ExitStack() as stack:
            if trainer.accelerator.is_main_process and (tracking.tensorboard or tracking.wandb):
                trainer.metrics_writer = stack.enter_context(
                    MetricsWriter(
                        track_dir,
                        tracking,
                        run_name=recipe.run,
                        attach=attach,
                        purge_step=resumed_from + 1 if resumed_from is not None else None,
                    )
                )
            result = trainer.train(resume_from_checkpoint=last)
    trainer.stop_clock.close()
    if trainer.stopped_for is not None:
        # checkpoint-<step> is saved and complete: nothing is published, the retry resumes from it
        from .preempt import STOPPED, TimeLimitStop

        step = int(trainer.state.global_step)
        if trainer.accelerator.is_main_process:  # what the rule's process reads after torchrun's exit
            atomic_write(out / STOPPED, json.dumps({"step": step, "why": trainer.stopped_for}) + "\n")
        raise TimeLimitStop(
            f"stopped at update {step} of {max_steps} with checkpoint-{step} saved: {trainer.stopped_for}",
            step=step,
            hint="a retry of the job (or a rerun) resumes from that checkpoint",
        )
    # written beside, then renamed: a kill during the save leaves the last final folder or none, never a mix
    final, tmp = out / "final", out / "final.tmp"
    if trainer.accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    trainer.save_model(str(tmp))  # the main process writes (the others return)
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(str(tmp))
        replace_folder(tmp, final)
    return {
        "engine": "trl",
        "steps": int(trainer.state.global_step),
        # this process's weights at the end: every data-parallel rank must hold the same
        "weights_sha256": state_sha256(trainer.accelerator.unwrap_model(trainer.model)),
        "resumed_from_step": resumed_from,
        "train_seconds": round(time.monotonic() - t0, 3),
        "train_loss": float(result.training_loss) if result.training_loss is not None else None,
        "final_checkpoint": str(final),
    }
