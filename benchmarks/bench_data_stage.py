"""Data-stage benchmark: a synthetic SWE-Gym-shaped split with one distinct image per row.

Prints the time of the first full run of the data stage (resolve -> download -> validate -> list_images ->
template map -> convert), of a no-op rerun, of a one-row change (one task added with a new image), and jobs
per second. Templates are `prebuilt` (template = image: no job per image), so the figures measure the
workflow itself, not image builds.

    .venv/bin/python benchmarks/bench_data_stage.py --rows 2438 [--cores 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sweflow.sample import numbered_rows, write_parquet  # noqa: E402


def run(workdir: Path, cores: int, *extra: str) -> tuple[float, int]:
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(ROOT / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--workflow-profile",
        "none",
        "--cores",
        str(cores),
        "data",
        *extra,
    ]
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if res.returncode != 0:
        sys.exit(f"snakemake failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    jobs = len(re.findall(r"^Finished jobid: \d+", res.stdout + res.stderr, re.M))
    return dt, jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2438)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--workdir", type=Path)
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sweflow-bench-"))
    data = workdir / "offline"
    data.mkdir(parents=True, exist_ok=True)
    rows = numbered_rows(args.rows)
    write_parquet(rows, data / "train.parquet")
    cfg = {
        "dataset": {
            "name": "bench",
            "revision": "0" * 40,
            "hub": {"endpoint": None, "offline_dir": str(data)},
            "splits": {"train": {"file": "train.parquet", "rows": None}},
            "select_splits": ["train"],
        },
        "images": {"prefix": "sweflow-bench/sweb.eval.x86_64."},
        "harness": {"package": "swebench", "extra_repos": "sample"},
        "sandbox": {"provider": "local", "prebuilt": True},
    }
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))

    first, jobs1 = run(workdir, args.cores)
    noop, jobs2 = run(workdir, args.cores)
    write_parquet(numbered_rows(args.rows + 1), data / "train.parquet")  # one new row at the end
    change, jobs3 = run(workdir, args.cores)

    print(f"rows={args.rows} images={args.rows} cores={args.cores} workdir={workdir}")
    print(f"first full run : {first:8.1f} s  ({jobs1} jobs, {jobs1 / first:.1f} jobs/s)")
    print(f"no-op rerun    : {noop:8.1f} s  ({jobs2} jobs)")
    print(f"one-row change : {change:8.1f} s  ({jobs3} jobs)")


if __name__ == "__main__":
    main()
