"""Slurm's time limit on verl's v1 trainer: save and stop at a step boundary before it (`install_deadline`).

The rule is the TRL engine's (`preempt.StopClock`); the engine then raises `TimeLimitStop` and a retry resumes.
"""

# verl's v1 trainer saves every `save_freq` steps and knows no deadline (the ESI check is its legacy trainer's).
# After each step's own work (`on_step_end`, inside the step, where verl saves), when the job's time left is
# less than the slowest step and save with the margin: save now unless this step just did (a checkpoint named
# by the step it holds), leave `stopped.json` beside the checkpoints, and make this the loop's last step
# (`total_training_steps` = this step), so verl logs the step's metrics and returns from `fit` normally.

from __future__ import annotations

import functools
import json
import logging
import time
from pathlib import Path
from typing import Any

from ..util import atomic_write
from .preempt import STOPPED, StopClock

log = logging.getLogger("sweflow.train.verl")

_MARK = "_sweflow_deadline"


def _saves_this_step(trainer: Any) -> bool:
    freq = int(trainer.config.trainer.save_freq)
    step = int(trainer.global_steps)
    return freq > 0 and (step >= int(trainer.total_training_steps) or step % freq == 0)


def _on_step_end(original: Any, clock_factory: Any) -> Any:
    @functools.wraps(original)
    def on_step_end(self: Any) -> Any:
        out = original(self)
        clock = getattr(self, "_sweflow_stop_clock", None)
        if clock is None:
            clock = self._sweflow_stop_clock = clock_factory()
        saved = (getattr(self, "timing_raw", None) or {}).get("save_checkpoint")
        if saved:
            clock.saved(float(saved))
        step = int(self.global_steps)
        why = clock.boundary(last_next=step + 1 >= int(self.total_training_steps))
        if why is None or step >= int(self.total_training_steps):
            return out
        if not _saves_this_step(self):
            t0 = time.monotonic()
            self._save_checkpoint()
            clock.saved(time.monotonic() - t0)
        folder = Path(self.config.trainer.default_local_dir).parent
        atomic_write(folder / STOPPED, json.dumps({"step": step, "why": why}) + "\n")
        log.warning("saved at step %d and stopping: %s", step, why)
        self.total_training_steps = step  # verl's loop logs this step and returns
        return out

    setattr(on_step_end, _MARK, True)
    return on_step_end


def install_deadline(trainer_cls: Any, clock_factory: Any = StopClock) -> None:
    """Wrap `trainer_cls.on_step_end` (verl's PPOTrainerSync) with the deadline rule; idempotent."""
    current = trainer_cls.__dict__.get("on_step_end")
    if current is None or getattr(current, _MARK, False):
        return
    trainer_cls.on_step_end = _on_step_end(current, clock_factory)
