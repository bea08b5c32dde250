"""Slurm's time limit as a normal event: `StopClock` says at each step boundary whether to save and stop
(signalled, or the job's time left is less than a step and a save); the run then raises `TimeLimitStop`, and
the rule's retries (`grpo_retries`) resume it in a new job. See docs/slurm.md.
"""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import time
from collections.abc import Callable

from ..errors import TrainError
from ..util import run_cmd

log = logging.getLogger("sweflow.train")

# A TRL rank that stopped for the time limit exits with this status (EX_TEMPFAIL: try again later); torchrun
# reports 1 whatever its ranks' status, so rank 0 also leaves STOPPED in the work folder.
EXIT_TIME_LIMIT = 75
STOPPED = "stopped.json"
# The rule's `--signal=URG@<lead>` (`slurm_signal_option`): Slurm sends it to every process of the job's steps,
# Snakemake's own included; its default action is to ignore it, so only the trainer, which handles it, acts.
# USR1 (or TERM) would end Snakemake's process in the step first, and `B:` the batch shell (both measured on
# the CI's Slurm 22.05). SIGUSR1 is also handled, for an operator's `kill -USR1 <trainer pid>`.
STOP_SIGNALS = (signal.SIGURG, signal.SIGUSR1)
# Slurm may send the signal up to a minute earlier than asked (its timer's resolution)
SIGNAL_LEAD_S = 600
MARGIN = 1.25  # the next step and its save may take this much longer than the slowest so far
SLACK_S = 5.0  # and this many seconds more (process exit, Snakemake's own bookkeeping)


class TimeLimitStop(TrainError):
    """The run saved a checkpoint at update `step` and stopped before Slurm's time limit; a retry resumes it."""

    def __init__(self, problem: str, *, step: int | None = None, **kw: str) -> None:
        super().__init__(problem, **kw)
        self.step = step


def parse_time_left(text: str) -> float | None:
    """Seconds in squeue's `%L` ([days-][hours:]minutes:seconds); None for UNLIMITED, NOT_SET, INVALID."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(x) if x else 0 for x in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def slurm_time_left(job_id: str) -> float | None:
    """Seconds job `job_id` has left before its time limit (None: no limit, or Slurm did not answer)."""
    try:
        res = run_cmd(["squeue", "-h", "-j", str(job_id), "-o", "%L"], timeout=30)
    except Exception as exc:  # noqa: BLE001 - a missing squeue or a timeout: keep training
        log.debug("squeue failed: %s", exc)
        return None
    return parse_time_left(res.stdout) if res.returncode == 0 else None


class StopClock:
    """Whether to save and stop at this step boundary (see the module docstring). Installs its signal
    handlers when made in the main thread; `close()` puts the previous ones back."""

    def __init__(
        self,
        job_id: str | None = None,
        *,
        time_left: Callable[[str], float | None] = slurm_time_left,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_id = job_id if job_id is not None else (os.environ.get("SLURM_JOB_ID") or None)
        self._time_left, self._clock = time_left, clock
        self.signalled: int | None = None
        self.slowest_step_s = 0.0
        self.slowest_save_s = 0.0
        self._last_boundary = clock()
        self._deadline: float | None = None
        self._previous: dict[int, object] = {}
        try:
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        except ValueError:  # not the main thread: the deadline alone decides
            self._previous.clear()

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.signalled is None:
            self.signalled = signum
            log.warning("got %s: saving and stopping at the next step boundary", signal.Signals(signum).name)

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def start(self) -> None:
        """Training starts: the first step is timed from here."""
        self._last_boundary = self._clock()

    def saved(self, seconds: float) -> None:
        """A checkpoint save took `seconds`."""
        self.slowest_save_s = max(self.slowest_save_s, seconds)

    def lead_s(self, *, last: bool = False) -> float:
        """How long before the limit to stop: the slowest step and save so far, with the margin; before the
        run's `last` step, a second save's worth more for the finish (the final weights written and published),
        which no later boundary can stop."""
        saves = 2 if last else 1
        return MARGIN * (self.slowest_step_s + saves * self.slowest_save_s) + SLACK_S

    def seconds_left(self) -> float | None:
        """Seconds before the job's time limit (asked of Slurm; the last answer when it does not reply)."""
        if self.job_id:
            left = self._time_left(self.job_id)
            if left is not None:
                self._deadline = self._clock() + left
        return None if self._deadline is None else self._deadline - self._clock()

    def boundary(self, *, last_next: bool = False) -> str | None:
        """Call at each step boundary: why to save and stop now (None: go on). `last_next`: the next step is
        the run's last."""
        now = self._clock()
        self.slowest_step_s = max(self.slowest_step_s, now - self._last_boundary)
        self._last_boundary = now
        if self.signalled is not None:
            return f"the job got {signal.Signals(self.signalled).name}"
        left = self.seconds_left()
        lead = self.lead_s(last=last_next)
        if left is not None and left < lead:
            what = "the last step and the finish" if last_next else "a step and a save"
            return f"{left:.0f} s left before Slurm's time limit, less than {what} ({lead:.0f} s)"
        return None


def grpo_retries(total_steps: int, save_every: int, *, main_process: bool = True) -> int:
    """Snakemake retries for the training job: one per save interval of the run, at least 1 (each attempt
    that reaches a step boundary saves, and the next resumes there). 0 in a job's own Snakemake
    (`main_process` False: pass `workflow.is_main_process`): it would retry inside the same allocation, whose
    time is up; the retry must be a new Slurm job, submitted by the main Snakemake."""
    if not main_process:
        return 0
    return max(1, math.ceil(total_steps / max(1, save_every)))


def slurm_signal_option(lead_s: int = SIGNAL_LEAD_S) -> str:
    """The sbatch option that has Slurm signal the trainer `lead_s` seconds before the time limit."""
    return f"--signal=URG@{int(lead_s)}"


# work/attempts.jsonl: {"job", "attempt", "started_from"} when an attempt starts, then {"job", "stopped_at",
# "why"} or {"job", "finished", "resumed_from"} when it ends on its own; a crash or a kill leaves the start alone.
CRASHES_BEFORE_GIVING_UP = 2


def no_progress(records: list[dict], *, attempt: int, from_step: int) -> str | None:
    """Why a Snakemake retry (`attempt` > 1) must not train again: the last CRASHES_BEFORE_GIVING_UP attempts
    started from `from_step` too and ended without stopping or finishing (a crash, or a step longer than the
    job's time); None when it may. A first attempt (a rerun by hand) always may."""
    if attempt <= 1:
        return None
    crashed = 0
    for rec in reversed(records):
        if "started_from" not in rec:
            break  # an attempt that stopped or finished: progress was made
        if rec["started_from"] != from_step:
            break
        crashed += 1
    if crashed >= CRASHES_BEFORE_GIVING_UP:
        return (f"the last {crashed} attempts started at update {from_step} and ended without a checkpoint "
                "(a crash, or a step longer than the job's time limit)")  # fmt: skip
    return None
