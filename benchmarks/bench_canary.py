"""Benchmark: what canary tests cost a fresh evaluation, per sample task, with canaries on and off.

    .venv/bin/python benchmarks/bench_canary.py                   # local provider, every sample task
    .venv/bin/python benchmarks/bench_canary.py --provider docker --runs 3

For each task the gold patch is evaluated ``--runs`` times with canaries and as many without, alternating.
Prints per task: canaries planted (must-fail/must-pass), whether gold resolved both ways, the mean total
seconds of an evaluation each way, and the planning time (``canary_s``: reading the test files at the base
commit in the sandbox and applying the test patch on the host).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sweflow.grading.evaluate import evaluate_patch
from sweflow.sample import instance_ids, load_task

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_validate import _env  # noqa: E402  (the same sample environment)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provider", choices=["docker", "local"], default="local")
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args(argv)
    ids = instance_ids(None)
    with tempfile.TemporaryDirectory(prefix="sweflow-bench-canary-") as tmp:
        env = _env(args.provider, Path(tmp), ids)
        print(
            f"{'task':<22} {'canaries':>8} {'resolved':>8} {'on_s':>6} {'off_s':>6} {'extra_s':>7} {'plan_s':>6}"
        )
        extras = []
        for iid in ids:
            inst = load_task(iid)
            on, off, plan, planted, resolved = [], [], [], "", set()
            for _ in range(args.runs):
                for flag in (True, False):
                    res = evaluate_patch(
                        env.provider, env.templates[iid], env.meta(inst), inst["patch"], canaries=flag
                    )
                    resolved.add((flag, res.resolved))
                    (on if flag else off).append(res.timings.get("total_s", 0.0))
                    if flag:
                        plan.append(res.timings.get("canary_s", 0.0))
                        kinds = [c["expect"] for c in res.canaries]
                        planted = f"{kinds.count('fail')}/{kinds.count('pass')}"
            ok = "yes" if all(r for _, r in resolved) else "NO"
            extra = statistics.mean(on) - statistics.mean(off)
            extras.append(extra)
            print(
                f"{iid:<22} {planted:>8} {ok:>8} {statistics.mean(on):6.2f} {statistics.mean(off):6.2f} "
                f"{extra:7.2f} {statistics.mean(plan):6.2f}"
            )
        print(
            f"mean extra seconds per evaluation: {statistics.mean(extras):.2f} ({time.strftime('%Y-%m-%d')})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
