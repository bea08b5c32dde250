"""Slurm's time limit as a normal event (issue 45, point 4): when the trainer saves and stops
(sweflow.train.preempt), and a real training process that is signalled saves, exits cleanly and resumes.

The run on the real one-machine Slurm is tests/integration/test_slurm_requeue.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweflow.train.preempt import (
    EXIT_TIME_LIMIT,
    StopClock,
    grpo_retries,
    no_progress,
    parse_time_left,
    slurm_signal_option,
)

ROOT = Path(__file__).resolve().parents[2]


def test_squeue_time_left_is_read_in_seconds():
    assert parse_time_left("0:45") == 45
    assert parse_time_left("12:03\n") == 723
    assert parse_time_left("1:02:03") == 3723
    assert parse_time_left("2-01:00:00") == 2 * 86400 + 3600
    assert parse_time_left("UNLIMITED") is None and parse_time_left("INVALID") is None


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_trainer_stops_when_the_next_step_and_its_save_would_pass_the_limit():
    clock, limit = FakeClock(), 100.0
    stop = StopClock("42", time_left=lambda job: limit - clock.now, clock=clock)
    try:
        stop.start()
        clock.now = 20.0  # a 20 s step
        assert stop.boundary() is None  # 80 s left
        stop.saved(4.0)
        clock.now = 40.0
        assert stop.boundary() is None  # 60 s left > 1.25 x (20 + 4) + 5
        clock.now = 70.0  # a slower step: 30 s
        why = stop.boundary()  # 30 s left < 1.25 x (30 + 4) + 5
        assert why and "30 s left before Slurm's time limit" in why, why
    finally:
        stop.close()


def test_before_the_last_step_the_finish_is_reserved_too():
    """No boundary follows the last step: its final save and the publish must fit in what is left."""
    clock, limit = FakeClock(), 100.0
    stop = StopClock("42", time_left=lambda job: limit - clock.now, clock=clock)
    try:
        stop.start()
        clock.now = 20.0  # a 20 s step
        assert stop.boundary() is None
        stop.saved(10.0)
        clock.now = 40.0  # 60 s left: 1.25 x (20 + 10) + 5 = 42.5 fits, 1.25 x (20 + 2 x 10) + 5 = 55 fits
        assert stop.boundary() is None and stop.boundary(last_next=True) is None
        clock.now = 50.0  # 50 s left: a step and a save fit, not the last step and the finish
        assert stop.boundary() is None
        why = stop.boundary(last_next=True)
        assert why and "less than the last step and the finish (55 s)" in why, why
    finally:
        stop.close()


def test_without_an_answer_from_slurm_the_last_known_limit_holds():
    clock, answers = FakeClock(), [50.0]
    stop = StopClock("42", time_left=lambda job: answers.pop() if answers else None, clock=clock)
    try:
        clock.now = 5.0
        assert stop.boundary() is None  # 50 s left
        clock.now = 45.0  # squeue silent now: 10 s left by the first answer
        assert stop.boundary() is not None
    finally:
        stop.close()
    outside = StopClock(None, time_left=lambda job: pytest.fail("no job: Slurm is not asked"))
    outside.close()
    assert outside.boundary() is None


@pytest.mark.parametrize("sig", [signal.SIGURG, signal.SIGUSR1])
def test_the_stop_signal_is_kept_for_the_next_step_boundary(sig):
    before = signal.getsignal(sig)
    stop = StopClock(None)
    try:
        os.kill(os.getpid(), sig)
        time.sleep(0.05)
        assert stop.boundary() == f"the job got {sig.name}"
    finally:
        stop.close()
    assert signal.getsignal(sig) == before


def test_retries_are_sized_to_the_save_intervals_and_only_the_main_snakemake_retries():
    assert grpo_retries(500, 10) == 50  # the production recipe
    assert grpo_retries(2, 1) == 2 and grpo_retries(3, 10) == 1
    assert grpo_retries(500, 10, main_process=False) == 0
    assert slurm_signal_option(120) == "--signal=URG@120"


def test_a_retry_after_two_attempts_without_progress_fails_at_once():
    start = lambda step: {"job": "1", "attempt": 2, "started_from": step}  # noqa: E731
    stopped = {"job": "1", "stopped_at": 4, "why": "the job got SIGURG"}
    # stopped at 4, then one crash at 4: a transient fault may pass, retry
    assert no_progress([start(0), stopped, start(4)], attempt=3, from_step=4) is None
    # two crashes at 4: the third would be the same
    why = no_progress([start(0), stopped, start(4), start(4)], attempt=4, from_step=4)
    assert why and "the last 2 attempts started at update 4" in why
    # a crash at 4 then one at 8 made progress in between (a save): retry
    assert no_progress([start(4), start(8)], attempt=3, from_step=8) is None
    # a rerun by hand (attempt 1) always trains
    assert no_progress([start(4), start(4), start(4)], attempt=1, from_step=4) is None


@pytest.mark.slow
def test_a_signalled_training_process_saves_exits_75_and_the_rerun_finishes_every_step(tmp_path):
    """The train_grpo rule's body on the tiny model (tests/fixtures/slurm_requeue/toy_train.py), a real
    process: SIGUSR1 after its third step -> checkpoint at the next boundary, status 75, nothing published;
    the rerun resumes there and ends with the uninterrupted run's 8 steps, rollout files and weights."""
    pytest.importorskip("trl")
    summary = tmp_path / "grpo" / "summary.json"
    cmd = [sys.executable, "-m", "tests.fixtures.slurm_requeue.toy_train", str(summary), "--steps", "8",
           "--save-every", "4"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = tmp_path / "first.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([*cmd, "--sleep", "1"], stdout=fh, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 240
        while "step 3:" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGUSR1)
        rc = proc.wait(timeout=240)
    text = log.read_text()
    assert rc == EXIT_TIME_LIMIT, text[-3000:]
    work = tmp_path / "grpo" / "work"
    attempt = [json.loads(x) for x in (work / "attempts.jsonl").read_text().splitlines()][-1]
    stopped = attempt["stopped_at"]
    assert 3 <= stopped < 8 and "the job got SIGUSR1" in attempt["why"], attempt
    from sweflow.train.resume import checkpoint_problem

    assert checkpoint_problem(work / "checkpoints" / f"checkpoint-{stopped}") is None
    assert not summary.exists() and not (tmp_path / "grpo" / "final").exists()

    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert f"resuming from checkpoint-{stopped}" in res.stdout + res.stderr
    out = json.loads(summary.read_text())
    assert out["steps"] == 8 and out["resumed_from_step"] == stopped
    steps = [json.loads(x)["step"] for x in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))
    # the same weights as the uninterrupted run: the same tasks in the same order, the same samples
    plain = tmp_path / "plain" / "grpo" / "summary.json"
    res = subprocess.run(
        [*cmd[:3], str(plain), *cmd[4:]], capture_output=True, text=True, env=env, timeout=300
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert out["final_weights"] == json.loads(plain.read_text())["final_weights"]
    # the resumed run numbered its rollout steps on from the checkpoint: one file per step, none rewritten
    records = {p.name: json.loads(p.read_text().splitlines()[0])["step"]
               for p in (tmp_path / "grpo" / "rollouts").glob("step-*.jsonl")}  # fmt: skip
    assert records == {f"step-{i}.jsonl": i for i in range(1, 9)}


@pytest.mark.slow
def test_a_signal_to_one_data_parallel_rank_stops_every_rank_at_the_same_step(tmp_path):
    """2 TRL ranks under torchrun (gloo, tests/fixtures/toy_dp_stop.py); only rank 1 gets SIGUSR1, during its
    third step: both stop after update 3 with the same weights, and one complete checkpoint-3."""
    pytest.importorskip("trl")
    from sweflow.offline.tiny_model import build_tiny_model
    from sweflow.train.preempt import STOPPED
    from sweflow.train.resume import checkpoint_problem
    from sweflow.util import free_port

    model = build_tiny_model(tmp_path / "model")
    out = tmp_path / "run"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}",
           str(ROOT / "tests" / "fixtures" / "toy_dp_stop.py"), str(out), str(model)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["stopped"] for r in ranks] == [3, 3], ranks
    assert ranks[0]["end"] == ranks[1]["end"]
    assert json.loads((out / STOPPED).read_text())["step"] == 3
    assert checkpoint_problem(out / "checkpoints" / "checkpoint-3") is None
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
