"""Benchmark: validate the sample tasks (gold + empty, `--repeats` each) with 1, 2 and 4 parallel jobs.

    .venv/bin/python benchmarks/bench_validate.py                 # Docker, all 9 sample tasks
    .venv/bin/python benchmarks/bench_validate.py --provider local --workers 1,2

One job = one task (like one Snakemake validate_task job). Prints tasks per minute, and the per-task
overhead beyond the test run itself: sandbox create + reset/apply + kill, i.e. the sum of
each evaluation's total time minus the time its evaluator command ran.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sweflow.grading.task_validation import validate_task
from sweflow.sample import instance_ids, load_task


def _env(provider: str, tmp: Path, ids):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.integration.conftest_validation import docker_env, local_env

    return (docker_env if provider == "docker" else local_env)(tmp, ids=ids)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provider", choices=["docker", "local"], default="docker")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    ids = instance_ids(None)
    with tempfile.TemporaryDirectory(prefix="sweflow-bench-validate-") as tmp:
        t = time.monotonic()
        env = _env(args.provider, Path(tmp), ids)
        print(f"setup ({args.provider}, {len(ids)} templates): {time.monotonic() - t:.1f}s")
        tasks = [(load_task(i), i) for i in ids]
        print(
            f"{'jobs':>4} {'wall_s':>7} {'tasks/min':>9} {'eval_s/task':>11} {'overhead_s/task':>15} {'valid':>5}"
        )
        for workers in [int(w) for w in args.workers.split(",")]:

            def one(item):
                inst, _ = item
                return validate_task(
                    env.provider,
                    env.meta(inst),
                    inst["patch"],
                    repeats=args.repeats,
                )

            t0 = time.monotonic()
            with cf.ThreadPoolExecutor(max_workers=workers) as pool:
                recs = list(pool.map(one, tasks))
            wall = time.monotonic() - t0
            ev = statistics.mean(r["timings"]["eval_s"] for r in recs)
            over = statistics.mean(r["timings"]["overhead_s"] for r in recs)
            valid = sum(r["verdict"] == "valid" for r in recs)
            print(
                f"{workers:>4} {wall:>7.1f} {len(recs) / wall * 60:>9.1f} {ev:>11.2f} {over:>15.2f} {valid:>5}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
