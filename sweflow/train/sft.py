"""Supervised fine-tuning on chat trajectories (OpenAI-style messages + tools) with TRL's `SFTTrainer`.

Each row is rendered with the model's chat template and tokenized once; only the tokens the model generates
in its own turns are trained on (assistant-only loss; how the mask is built: above `_mask_plan`). A row
over `max_length` tokens is truncated or dropped (`overlong`) and counted, with its length, in the summary.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import TrainError
from ..schema import default
from ..util import atomic_write, jsonl_line, replace_folder

log = logging.getLogger("sweflow.train")

OVERLONG = ("truncate", "drop")
_PLANS: dict[str, tuple[str | None, bool]] = {}  # chat template -> (template to render with, use markers)


@dataclass
class SFTSettings:
    epochs: float = default("sft.train.epochs")
    lr: float = default("sft.train.lr")
    lr_scheduler: str = default("sft.train.lr_scheduler")
    warmup_steps: int = default("sft.train.warmup_steps")
    weight_decay: float = default("sft.train.weight_decay")
    max_length: int = default("sft.train.max_length")
    # a row over max_length: "truncate" (its first max_length tokens) or "drop"
    overlong: str = default("sft.train.overlong")
    per_device_batch: int = default("sft.train.per_device_batch")
    grad_accum: int = default("sft.train.grad_accum")
    seed: int = default("sft.train.seed")
    save_every: int | None = default("sft.train.save_every")  # every N optimizer steps; None: never
    bf16: bool = default("sft.train.bf16")
    gradient_checkpointing: bool = default("sft.train.gradient_checkpointing")
    max_steps: int | None = default("sft.train.max_steps")  # None: `epochs` decide
    logging_steps: int = 1
    fsdp: str | None = None  # None or "fsdp2": how sweflow.train.sft_worker launches multi-process runs

    def __post_init__(self) -> None:
        if self.fsdp not in (None, "fsdp2"):
            raise TrainError(f"unknown fsdp mode {self.fsdp!r}", field="fsdp", hint="use null or 'fsdp2'")
        if self.overlong not in OVERLONG:
            raise TrainError(
                f"unknown overlong mode {self.overlong!r}", field="overlong", hint="use 'truncate' or 'drop'"
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> SFTSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data or {}) - known)
        if unknown:
            raise TrainError(
                f"unknown SFT setting(s) {', '.join(unknown)}", hint=f"known: {', '.join(sorted(known))}"
            )
        return cls(**dict(data or {}))


def _row_id(row: Mapping[str, Any], index: int | None = None) -> str:
    rid = row.get("id") or row.get("instance_id")
    return str(rid) if rid is not None else f"#{index if index is not None else '?'}"


def _messages(row: Mapping[str, Any], rid: str) -> list[dict[str, Any]] | None:
    """Copies of the row's messages with tool-call arguments as dicts; None when an argument is not a JSON
    object."""
    raw = row.get("messages")
    if not isinstance(raw, list) or not all(isinstance(m, Mapping) for m in raw):
        raise TrainError("`messages` is not a list of message objects", row=rid, field="messages")
    out = []
    for m in raw:
        msg = dict(m)
        if msg.get("tool_calls"):
            msg["tool_calls"] = [dict(c, function=dict(c.get("function") or {})) for c in msg["tool_calls"]]
            for call in msg["tool_calls"]:
                args = call["function"].get("arguments")
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except json.JSONDecodeError:
                        return None
                if not isinstance(args if args is not None else {}, dict):
                    return None
                call["function"]["arguments"] = args or {}
        out.append(msg)
    return out


# How the assistant mask is built, in the order TRL's SFTTrainer itself decides (sft_trainer.py: "swap in a
# training chat template with {% generation %} markers if the current template doesn't already have them"):
#
# 1. the tokenizer's template has `{% generation %}` markers: `apply_chat_template(...,
#   return_assistant_tokens_mask=True)`, the span the template marks (TRL's own training templates mark
#   `<|im_end|>\n`, newline included);
# 2. else TRL ships a training template for the model family (`trl.chat_template_utils.
#   get_training_chat_template`: prefix-preserving, with markers; e.g. Qwen3's keeps earlier reasoning): rows
#   are rendered and masked with it (the saved tokenizer keeps its own template for inference);
# 3. else (an unknown template without markers, like the tiny model's) the mask comes from prefixes: for each
#   assistant message i, `messages[:i]` rendered with the generation prompt must be a prefix of
#   `messages[:i+1]`, which must be a prefix of the next rendering and of the whole conversation. The
#   characters between the two are the model's turn, less the glue after its end-of-turn token (the "\n" after
#   `<|im_end|>`); a token is masked when it overlaps such a span (transformers maps marker spans to tokens
#   the same way). A template that is not prefix-stable raises TrainError naming the row.
def _mask_plan(tokenizer: Any) -> tuple[str | None, bool]:
    """(chat template to render with, None = the tokenizer's; whether it has generation markers)."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    own = tokenizer.chat_template
    if not own:
        raise TrainError("the tokenizer has no chat template", hint="SFT renders rows with it")
    key = own if isinstance(own, str) else json.dumps(own, sort_keys=True)
    if key not in _PLANS:
        if has_generation_markers(own):
            _PLANS[key] = (None, True)
        else:
            try:
                trl_template = get_training_chat_template(tokenizer)
            except Exception:  # no TRL training template for this family (ValueError), or its probe failed
                _PLANS[key] = (None, False)
            else:
                _PLANS[key] = (trl_template, trl_template is not None)
                log.info("assistant mask from TRL's training chat template for this model family")
    return _PLANS[key]


def _render(tokenizer: Any, messages: list, tools: list | None, rid: str, **kw: Any) -> Any:
    kw.setdefault("tokenize", False)
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, **kw)
    except Exception as exc:  # a jinja error in the model's own template
        raise TrainError(f"the chat template failed on this row: {exc}", row=rid, field="messages") from exc


def _turn_spans(tokenizer: Any, messages: list, tools: list | None, text: str, rid: str) -> list[tuple]:
    """Character spans of the assistant turns in `text` (the whole rendering), from prefix renderings."""
    specials = [s for s in tokenizer.all_special_tokens if s]
    spans, prev = [], ""
    for i, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        head = _render(tokenizer, messages[:i], tools, rid, add_generation_prompt=True)
        full = _render(tokenizer, messages[: i + 1], tools, rid)
        if not head.startswith(prev) or not full.startswith(head):
            raise TrainError(
                f"the chat template is not prefix-stable at message {i} (rendering the conversation up to it "
                "does not extend the rendering before it), so the assistant mask cannot be built",
                row=rid,
                hint="use a template with {% generation %} markers or one TRL ships a training template for",
            )
        turn = full[len(head) :]
        body = turn.rstrip()
        # the glue after the end-of-turn token (`<|im_end|>` + "\n") is not generated by the model
        end = len(head) + (len(body) if any(body.endswith(s) for s in specials) else len(turn))
        spans.append((len(head), end))
        prev = full
    if not text.startswith(prev):
        raise TrainError("the chat template is not prefix-stable at the last message", row=rid)
    return spans


def _span_mask(offsets: list, spans: list[tuple[int, int]]) -> list[int]:
    mask, j = [], 0
    for start, end in offsets:
        while j < len(spans) and spans[j][1] <= start:
            j += 1
        mask.append(int(j < len(spans) and start < spans[j][1] and end > spans[j][0]))
    return mask


# Each row is rendered with the model's chat template (tool-call `arguments` JSON strings parsed to dicts
# first, `tools` passed along) and tokenized once; only the tokens the model generates in its own turns are
# trained on (assistant-only loss). A row over `max_length` tokens is cut to its first `max_length` tokens
# (`overlong: truncate`, as SWE-smith's torchtune recipe does with `max_seq_len`) or dropped (`drop`); either
# way it is counted, with its length, in the summary.
def build_example(
    row: Mapping,
    tokenizer: Any,
    max_length: int,
    *,
    index: int | None = None,
    overlong: str = default("sft.train.overlong"),
) -> dict:
    """One tokenized example `{id, input_ids, assistant_masks, tokens}` (cut to `max_length` with
    `overlong="truncate"`, then also `truncated_from`: the whole length), or a dropped record
    `{id, dropped: "too_long" | "no_assistant_turn" | "bad_tool_arguments", tokens}`."""
    drop = overlong == "drop"
    rid = _row_id(row, index)
    messages = _messages(row, rid)
    if messages is None:
        return {"id": rid, "dropped": "bad_tool_arguments", "tokens": 0}
    if not any(m.get("role") == "assistant" for m in messages):
        return {"id": rid, "dropped": "no_assistant_turn", "tokens": 0}
    tools = row.get("tools") or None
    template, markers = _mask_plan(tokenizer)
    if markers:
        kw = {"tokenize": True, "return_dict": True, "return_assistant_tokens_mask": True}
        out = _render(tokenizer, messages, tools, rid, chat_template=template, **kw)
        ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
        if drop and len(ids) > max_length:
            return {"id": rid, "dropped": "too_long", "tokens": len(ids)}
    else:
        text = _render(tokenizer, messages, tools, rid)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        if drop and len(ids) > max_length:  # before the prefix renderings, which are the costly part
            return {"id": rid, "dropped": "too_long", "tokens": len(ids)}
        mask = _span_mask(enc["offset_mapping"], _turn_spans(tokenizer, messages, tools, text, rid))
    whole = len(ids)
    ids, mask = ids[:max_length], mask[:max_length]
    if 1 not in mask:
        return {"id": rid, "dropped": "no_assistant_turn", "tokens": whole}
    ex = {"id": rid, "input_ids": ids, "assistant_masks": mask, "tokens": len(ids)}
    if whole > len(ids):
        ex["truncated_from"] = whole
    return ex


def prepare_examples(
    rows: Iterable[Mapping[str, Any]],
    tokenizer: Any,
    max_length: int,
    overlong: str = default("sft.train.overlong"),
) -> tuple[list, list]:
    """(kept examples, dropped records) of `rows`, in order."""
    kept, dropped = [], []
    for n, row in enumerate(rows):
        ex = build_example(row, tokenizer, max_length, index=n, overlong=overlong)
        (dropped if "dropped" in ex else kept).append(ex)
    return kept, dropped


def _trainer_class():
    import torch
    from trl import SFTTrainer

    class _CountingSFTTrainer(SFTTrainer):
        """Counts the tokens (attended, and trained on) of each step, summed over ranks at each log."""

        _tok = 0
        _asst = 0

        def training_step(self, model, inputs, num_items_in_batch=None):
            mask = inputs.get("attention_mask")
            self._tok += int(mask.sum() if mask is not None else inputs["input_ids"].numel())
            self._asst += int((inputs["labels"] != -100).sum())
            return super().training_step(model, inputs, num_items_in_batch)

        def _save_checkpoint(self, model, trial):
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            from .resume import write_checkpoint_marker

            super()._save_checkpoint(model, trial)
            # every process has written its part before the marker says the folder is whole
            self.accelerator.wait_for_everyone()
            if self.accelerator.is_main_process:
                step = int(self.state.global_step)
                write_checkpoint_marker(
                    Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{step}", step
                )

        def log(self, logs, start_time=None):
            if "loss" in logs and self.model.training:  # every rank logs each logging step
                counts = torch.tensor([self._tok, self._asst], device=self.accelerator.device)
                counts = self.accelerator.reduce(counts, reduction="sum")
                logs["sweflow_tokens"], logs["sweflow_assistant_tokens"] = (int(x) for x in counts.tolist())
                self._tok = self._asst = 0
            super().log(logs, start_time)

    return _CountingSFTTrainer


def _metrics_callback(metrics_path: Path, history: list[dict], write: bool):
    from transformers import TrainerCallback

    class _Metrics(TrainerCallback):
        """One JSONL line per logged step (rank 0 appends and flushes; every rank keeps `history`)."""

        def __init__(self) -> None:
            self.busy, self.steps, self.t0 = 0.0, 0, None
            last = history[-1] if history else {}
            self.total = [int(last.get("tokens_total", 0)), int(last.get("assistant_tokens_total", 0))]

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.monotonic()

        def on_step_end(self, args, state, control, **kw):
            if self.t0 is not None:
                self.busy += time.monotonic() - self.t0
                self.steps += 1
            self.t0 = None

        def on_log(self, args, state, control, logs=None, **kw):
            logs = logs or {}
            if "loss" not in logs or "sweflow_tokens" not in logs:
                return
            tok, asst = int(logs["sweflow_tokens"]), int(logs["sweflow_assistant_tokens"])
            self.total = [self.total[0] + tok, self.total[1] + asst]
            line = {
                "step": state.global_step,
                "epoch": round(float(state.epoch or 0), 6),
                "loss": float(logs["loss"]),
                "lr": float(logs.get("learning_rate", 0.0)),
                "tokens": tok,
                "assistant_tokens": asst,
                "tokens_total": self.total[0],
                "assistant_tokens_total": self.total[1],
                "step_time_s": round(self.busy / max(self.steps, 1), 6),
            }
            for key in ("grad_norm", "mean_token_accuracy", "entropy"):
                if logs.get(key) is not None:
                    line[key] = float(logs[key])
            self.busy, self.steps = 0.0, 0
            history.append(line)
            if write:
                with open(metrics_path, "a", encoding="utf-8") as fh:
                    fh.write(jsonl_line(line))
                    fh.flush()

    return _Metrics()


def _resume(ckpt_dir: Path, metrics_path: Path, write: bool) -> tuple[str | None, int, list[dict]]:
    """(last complete checkpoint or None, its step, the earlier run's metrics lines up to it; a newer partial
    checkpoint is skipped with a log line). The metrics file is rewritten with those lines only (a fresh run
    empties it; a torn last line from a crash is left out)."""
    from .resume import last_complete_checkpoint

    found = last_complete_checkpoint(ckpt_dir) if ckpt_dir.is_dir() else None
    last = str(found) if found else None
    step, lines = 0, []
    if last is not None:
        state = Path(last) / "trainer_state.json"
        step = json.loads(state.read_text())["global_step"] if state.exists() else int(last.split("-")[-1])
        for raw in metrics_path.read_text(encoding="utf-8").splitlines() if metrics_path.exists() else []:
            try:
                line = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if int(line.get("step", 0)) <= step:
                lines.append(line)
    if write:
        atomic_write(metrics_path, "".join(jsonl_line(x) for x in lines))
    return last, int(step), lines


# The tokenized examples go to SFTTrainer as a pre-tokenized dataset: `input_ids` + `assistant_masks`. TRL
# 1.16 recognises a processed dataset by its `input_ids` column and folds `assistant_masks` into `labels`
# (-100 where the mask is 0) whatever `assistant_only_loss` says, so `assistant_only_loss` stays False (it
# would demand a conversational dataset); `packing=False`, `max_length` is the limit applied here (TRL's own
# truncation is then a no-op).
def _sft_config(settings: SFTSettings, ckpt_dir: Path, report_to: list[str] | None = None):
    import torch
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(ckpt_dir),
        num_train_epochs=float(settings.epochs),
        max_steps=settings.max_steps if settings.max_steps else -1,
        learning_rate=settings.lr,
        lr_scheduler_type=settings.lr_scheduler,
        warmup_steps=settings.warmup_steps,
        weight_decay=settings.weight_decay,
        per_device_train_batch_size=settings.per_device_batch,
        gradient_accumulation_steps=settings.grad_accum,
        seed=settings.seed,
        data_seed=settings.seed,
        bf16=settings.bf16,
        # under an FSDP launch activation checkpointing is the plugin's (the Trainer refuses both)
        gradient_checkpointing=settings.gradient_checkpointing
        and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true",
        logging_steps=settings.logging_steps,
        save_strategy="steps" if settings.save_every else "no",
        save_steps=settings.save_every or 500,
        report_to=report_to or "none",
        disable_tqdm=True,
        packing=False,
        max_length=settings.max_length,
        assistant_only_loss=False,  # the mask comes as the `assistant_masks` column
        ddp_find_unused_parameters=False,
        # without it a CPU process of a multi-process launch trains alone (accelerate's MULTI_CPU needs cpu=True)
        use_cpu=not torch.cuda.is_available(),
        dataloader_pin_memory=torch.cuda.is_available(),
    )


def _publish(trainer: Any, tokenizer: Any, out_dir: Path) -> Path:
    """Save the final model + tokenizer into a temp folder, then rename it to `out_dir/final`."""
    final, tmp = out_dir / "final", out_dir / ".final.tmp"
    main = trainer.is_world_process_zero()
    if main and tmp.exists():
        shutil.rmtree(tmp)
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(tmp))  # every rank: FSDP gathers the full state dict for rank 0
    if main:
        tokenizer.save_pretrained(str(tmp))
        replace_folder(tmp, final)
    trainer.accelerator.wait_for_everyone()
    return final


def train_sft(
    rows: Iterable[Mapping[str, Any]],
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    settings: SFTSettings | None = None,
    *,
    metrics_path: str | os.PathLike,
    tracking: Mapping[str, Any] | None = None,
    tracking_dir: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Fine-tune the Hugging Face model in `model_dir` on `rows`; checkpoints in `out_dir/checkpoints`
    (resumed from the last one there), the final model + tokenizer in `out_dir/final`, one metrics line per
    logged step in `metrics_path`. Returns the run's summary (every rank; rank 0 wrote the files).

    `tracking`: the `train.tracking` section (TRL's `report_to`: TensorBoard under
    `<tracking_dir>/tensorboard/sft`, W&B when on; default `out_dir`); None - none."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    settings = settings or SFTSettings()
    started = time.monotonic()
    rows = list(rows)
    out_dir, metrics_path = Path(out_dir), Path(metrics_path)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    kept, dropped = prepare_examples(rows, tokenizer, settings.max_length, settings.overlong)
    truncated = [{"id": e["id"], "tokens": e["truncated_from"]} for e in kept if "truncated_from" in e]
    for t in truncated:
        log.warning("SFT row %s truncated: %d tokens to %d", t["id"], t["tokens"], settings.max_length)
    by_reason = dict(sorted(Counter(d["dropped"] for d in dropped).items()))
    if not kept:
        raise TrainError(
            f"nothing to train on: all {len(rows)} row(s) were dropped "
            f"({', '.join(f'{k}: {v}' for k, v in by_reason.items()) or 'no rows'})",
            hint=f"max_length is {settings.max_length}",
        )
    for d in dropped:
        log.warning("SFT row %s dropped: %s (%d tokens)", d["id"], d["dropped"], d["tokens"])
    dataset = Dataset.from_list(
        [{"input_ids": e["input_ids"], "assistant_masks": e["assistant_masks"]} for e in kept]
    )

    ckpt_dir = out_dir / "checkpoints"
    from .tracking import Tracking, tracking_env

    track = (
        Tracking.from_config({"tracking": tracking}) if tracking is not None else Tracking(False)
    ).checked()
    args = _sft_config(settings, ckpt_dir, track.report_to())
    args.run_name = Path(tracking_dir if tracking_dir is not None else out_dir).name
    main = args.process_index == 0
    if main:
        metrics_path.parent.mkdir(parents=True, exist_ok=True)
    resume, resumed_step, history = _resume(ckpt_dir, metrics_path, main)
    # the Trainer's loggers read their folders from the environment (TENSORBOARD_LOGGING_DIR, WANDB_*)
    with tracking_env(track.env(tracking_dir if tracking_dir is not None else out_dir, "sft")):
        trainer = _trainer_class()(
            model=str(model_dir),
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[_metrics_callback(metrics_path, history, main)],
        )
        if resume:
            log.info("resuming SFT from %s (step %d)", resume, resumed_step)
        trainer.train(resume_from_checkpoint=resume)
    final = _publish(trainer, tokenizer, out_dir)
    losses = [h["loss"] for h in history]
    return {
        "rows": len(rows),
        "kept": len(kept),
        "dropped": [{"id": d["id"], "reason": d["dropped"], "tokens": d["tokens"]} for d in dropped],
        "dropped_by_reason": by_reason,
        "truncated": truncated,
        "trained_tokens": history[-1]["tokens_total"] if history else 0,
        "assistant_tokens": history[-1]["assistant_tokens_total"] if history else 0,
        "steps": int(trainer.state.global_step),
        "epochs": float(trainer.state.epoch or 0),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "seconds": round(time.monotonic() - started, 3),
        "settings": asdict(settings),
        "world_size": int(args.world_size),
        "resumed_from_step": resumed_step if resume else None,
        "final": str(final),
    }
