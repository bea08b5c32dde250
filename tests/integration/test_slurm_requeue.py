"""Slurm's time limit mid-run is a normal event (issue 45, point 4), on the real one-machine Slurm of CI.

tests/fixtures/slurm_requeue: the train_grpo rule's body (TRL engine, tiny model, toy rollouts) with the
rule's time-limit plan (`--signal=URG@<lead>`, retries sized to the steps; sweflow.train.preempt), through
profiles/slurm. Its first attempt's steps are slow, so the 1-minute limit falls mid-run: the trainer is
signalled (or sees the limit coming), saves a complete checkpoint at a step boundary and exits; Snakemake's
retry resumes from that checkpoint and finishes with the step count of an uninterrupted run.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, merged_profile, snakemake_env

pytestmark = [pytest.mark.integration, pytest.mark.slurm, pytest.mark.slow]
FIXTURE = ROOT / "tests" / "fixtures" / "slurm_requeue"
FAST_POLL = ROOT / "tests" / "slurm_profile" / "fast_poll.py"
STEPS = 12


def _snakemake(work: Path, *args: str, timeout: int) -> subprocess.CompletedProcess:
    env = {**snakemake_env(work), "PYTHONPATH": str(ROOT)}
    cmd = ["timeout", "-k", "20", str(timeout), sys.executable, str(FAST_POLL), "--snakefile",
           str(FIXTURE / "Snakefile"), "--directory", str(work), "--workflow-profile", "none", *args]  # fmt: skip
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout + 60)
    res.seconds = time.monotonic() - t0
    return res


def _steps(work: Path) -> list[int]:
    return [
        json.loads(x)["step"] for x in (work / "grpo/metrics.jsonl").read_text().splitlines() if x.strip()
    ]


def test_a_time_limit_mid_run_is_saved_retried_and_finished_with_every_step(slurm_cluster, tmp_path):
    pytest.importorskip("trl")
    # the uninterrupted run: the same workflow on this machine, no time limit
    plain = _snakemake(tmp_path / "plain", "--cores", "1", "--config", f"steps={STEPS}", timeout=300)
    assert plain.returncode == 0, (plain.stdout + plain.stderr)[-4000:]

    work = tmp_path / "slurm"
    profile = merged_profile(tmp_path / "profile")
    res = _snakemake(work, "--profile", str(profile), "--config", f"steps={STEPS}", "sleep=6", "runtime=1",
                     "lead=30", timeout=420)  # fmt: skip
    out = res.stdout + res.stderr
    print(
        f"uninterrupted (local): {plain.seconds:.0f} s; under Slurm with a 1-minute limit: {res.seconds:.0f} s"
    )
    assert res.returncode == 0, out[-4000:]

    # the first job stopped itself at a step boundary with a complete checkpoint, then a new job resumed; a
    # retry that started late may be signalled too and stop again (each stop later than the one before)
    jobs = re.findall(r"submitted with SLURM jobid (\d+)", out)
    assert len(jobs) >= 2, out[-4000:]
    records = [json.loads(x) for x in (work / "grpo/work/attempts.jsonl").read_text().splitlines()]
    starts = [r for r in records if "started_from" in r]
    attempts = [r for r in records if "started_from" not in r]
    assert [a["job"] for a in attempts] == jobs, records
    stops = [a["stopped_at"] for a in attempts[:-1]]
    for job, a in zip(jobs, attempts[:-1], strict=False):
        print(f"job {job} stopped at update {a['stopped_at']}: {a['why']}")
        assert "the job got SIGURG" in a["why"] or "before Slurm's time limit" in a["why"], a
    assert 0 < stops[0] and stops == sorted(set(stops)) and stops[-1] < STEPS, stops
    stopped_at = stops[-1]
    assert attempts[-1] == {"job": jobs[-1], "finished": STEPS, "resumed_from": stopped_at}, attempts
    assert starts == [{"job": j, "attempt": i + 1, "started_from": ([0, *stops])[i]}
                      for i, j in enumerate(jobs)], records  # fmt: skip
    assert "TIMEOUT" not in out  # it ended before Slurm had to kill it

    summary = json.loads((work / "grpo/summary.json").read_text())
    uninterrupted = json.loads((tmp_path / "plain/grpo/summary.json").read_text())
    assert summary["resumed_from_step"] == stopped_at and uninterrupted["resumed_from_step"] is None
    assert summary["steps"] == uninterrupted["steps"] == STEPS
    assert summary["final_weights"] == uninterrupted["final_weights"]
    assert _steps(work) == _steps(tmp_path / "plain") == list(range(1, STEPS + 1))
    rollouts = sorted(p.name for p in (work / "grpo/rollouts").iterdir())
    assert rollouts == sorted(f"step-{i}.jsonl" for i in range(1, STEPS + 1))
