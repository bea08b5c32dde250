"""Benchmark: SWE-smith at 50,000 candidates — candidate generation per shard, the DAG's size and planning
time, the per-candidate validation cost, and gather + summary over 50,000 validation reports.

    .venv/bin/python benchmarks/bench_smith.py                      # 50,000 candidates, 100 shards
    .venv/bin/python benchmarks/bench_smith.py --candidates 5000 --shards 10

The repository is synthetic: the sample repository's package copied K times (calclib_0 ... calclib_K-1,
each with its own tests), enough copies for the requested number of procedural candidates. Validation is
measured on the real sample repository with the local (bubblewrap) provider for `--validate` candidates
and extrapolated; everything else runs at full size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sweflow.sample import materialize_repo  # noqa: E402
from sweflow.smith.candidates import write_jsonl  # noqa: E402
from sweflow.smith.gitrepo import checkout, run_git, source_files  # noqa: E402
from sweflow.smith.procedural import procedural_candidates  # noqa: E402

PER_COPY = 163  # procedural candidates of one copy with per_entity=3 (seed 0)


def synthetic_repo(dest: Path, copies: int) -> tuple[Path, str]:
    info = materialize_repo(dest / "sample")
    src = checkout(info.path, info.head, dest / "src")
    repo = dest / "big"
    (repo / "tests").mkdir(parents=True)
    for k in range(copies):
        name = f"calclib_{k}"
        (repo / name).mkdir()
        for f in sorted((src / "calclib").glob("*.py")):
            (repo / name / f.name).write_text(f.read_text().replace("calclib", name))
        for f in sorted((src / "tests").glob("test_*.py")):
            (repo / "tests" / f"{f.stem}_{k}.py").write_text(f.read_text().replace("calclib", name))
    run_git(repo, "init", "-q", "--template=")
    run_git(repo, "add", "-A")
    run_git(repo, "commit", "-q", "-m", "synthetic", date="2000-01-01T00:00:00+00:00")
    return repo, run_git(repo, "rev-parse", "HEAD").stdout.strip()


def bench_generation(repo: Path, commit: str, shards: int, out: Path) -> list:
    files = source_files(repo)
    t0 = time.monotonic()
    per_shard, allc = [], []
    for s in range(shards):
        t = time.monotonic()
        cands = procedural_candidates(repo, files, repo="bench/big", commit=commit, seed=0, shard=s,
                                      shards=shards, per_entity=3)  # fmt: skip
        write_jsonl(out / f"{s}.jsonl", (c.to_dict() for c in cands))
        per_shard.append(time.monotonic() - t)
        allc.extend(cands)
    total = time.monotonic() - t0
    print(f"generation: {len(allc)} candidates from {len(files)} files in {shards} shards: {total:.1f} s "
          f"(per shard max {max(per_shard):.2f} s, mean {total / shards:.2f} s)")  # fmt: skip
    return allc


def bench_dag(shards: int, tmp: Path) -> None:
    cfg = tmp / "bench.yaml"
    cfg.write_text(json.dumps({"smith": {"enabled": True, "dataset": "smith-bench", "strategies": {
        "procedural": {"shards": shards}, "lm_modify": {"shards": max(1, shards // 10)},
        "lm_rewrite": {"shards": max(1, shards // 10)}, "pr_mirror": {"shards": 1},
        "combine": {"shards": max(1, shards // 10)}}, "statements": {"shards": max(1, shards // 10)}},
        "train": {"enabled": False}, "e2e": {"instance": None}}))  # fmt: skip
    work = tmp / "dag"
    work.mkdir()
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(work),
           "results/smith/calclib/summary.json", "resources/datasets/smith-bench/train.parquet",
           "--configfile", str(ROOT / "config" / "config.yaml"), str(cfg), "-n", "--quiet", "rules"]  # fmt: skip
    t = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    dt = time.monotonic() - t
    jobs = [ln.split() for ln in res.stdout.splitlines() if ln.strip() and ln.split()[-1].isdigit()]
    table = {r[0]: int(r[1]) for r in jobs if len(r) == 2}
    print(f"DAG (smith branch, {shards} procedural shards): {table.get('total')} jobs, planned in {dt:.1f} s")
    print("  " + ", ".join(f"{k} {v}" for k, v in table.items() if k != "total"))
    if res.returncode:
        print(res.stderr[-2000:])


def bench_validation(n: int, tmp: Path) -> None:
    from tests.integration.conftest_validation import bwrap_available

    if bwrap_available():
        print("validation: skipped (no bubblewrap)")
        return
    from sweflow.harness import load_harness
    from sweflow.sandbox.registry import provider_from_config
    from sweflow.sandbox.settings import SandboxSettings
    from sweflow.smith.bug_validation import validate_candidate
    from sweflow.smith.env import build_environment, materialize_source
    from sweflow.smith.profile import load_profile

    prof = load_profile("sample")
    src = materialize_source(prof, tmp / "v" / "repo.git")
    cfg = SandboxSettings.from_config({"local": {"templates_root": str(tmp / "v" / "templates")}})
    tpl = build_environment(provider_from_config("local", cfg, purpose="build"), "local", prof,
                            tmp / "v" / "repo.git", src["commit"], settings=cfg)["template"]  # fmt: skip
    tree = checkout(tmp / "v" / "repo.git", src["commit"], tmp / "v" / "tree")
    cands = procedural_candidates(tree, source_files(tree), repo=prof.repo, commit=src["commit"], seed=0,
                                  max_candidates=n)  # fmt: skip
    prov = provider_from_config("local", cfg, purpose="eval")
    parser = load_harness("swebench").find_parser(prof.log_parser)
    ref = {"passed": []}
    from sweflow.smith.bug_validation import reference_run, reference_verdict

    ref = reference_verdict(reference_run(prov, tpl, prof, src["commit"], parser=parser), prof)
    t = time.monotonic()
    reps = [validate_candidate(prov, tpl, prof, src["commit"], c, ref, parser=parser, runs=2) for c in cands]
    per = (time.monotonic() - t) / len(cands)
    kept = sum(r["status"] == "kept" for r in reps)
    print(f"validation (local provider, k=2, 55-test suite): {per:.2f} s per candidate ({len(cands)} measured, "
          f"{kept} kept) -> 50,000 candidates = {50000 * per / 3600:.1f} CPU-job hours, "
          f"{50000 * per / 100 / 60:.0f} min per job with 100 shards")  # fmt: skip


def bench_gather(cands: list, tmp: Path, repo: Path, commit: str, kept_share: float) -> None:
    from sweflow.stages.smith import gather_step

    bare = tmp / "g" / "repo.git"
    bare.parent.mkdir()
    run_git(tmp, "clone", "-q", "--bare", str(repo), str(bare))
    reports, files = tmp / "g" / "reports.jsonl", tmp / "g" / "cands.jsonl"
    step = max(1, round(1 / kept_share))
    lines = []
    for i, c in enumerate(cands):
        k = c.files[0].split("/")[0].rsplit("_", 1)[1]
        lines.append({"instance_id": c.instance_id, "strategy": c.strategy,
                      "status": "kept" if i % step == 0 else "no_fail_to_pass",
                      "FAIL_TO_PASS": [f"tests/test_stats_{k}.py::test_mean"],
                      "PASS_TO_PASS": [f"tests/test_stats_{k}.py::test_mode_prefers_smallest_on_ties"]})  # fmt: skip
    write_jsonl(reports, lines)
    write_jsonl(files, (c.to_dict() for c in cands))
    env = tmp / "g" / "env.json"
    env.write_text(json.dumps({"ok": True, "commit": commit, "date": "2000-01-01T00:00:00+00:00",
                               "profile": {"name": "big", "repo": "bench/big", "source": str(repo)},
                               "reference": {"ok": True, "tests": 0, "share": 1.0}}))  # fmt: skip
    t = time.monotonic()
    summary = gather_step(env, bare, [str(reports)], [str(files)], tmp / "g" / "tasks.jsonl",
                          tmp / "g" / "tasks.git", tmp / "g" / "summary.json")  # fmt: skip
    dt = time.monotonic() - t
    size = sum(f.stat().st_size for f in (tmp / "g" / "tasks.git").rglob("*") if f.is_file())
    print(f"gather: {summary['candidates']} reports, {summary['tasks']} tasks committed in {dt:.1f} s "
          f"({dt / max(1, summary['tasks']) * 1000:.0f} ms per task); tasks.git {size / 1e6:.1f} MB")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=50000)
    ap.add_argument("--shards", type=int, default=100)
    ap.add_argument(
        "--validate", type=int, default=10, help="candidates validated for the per-candidate cost"
    )
    ap.add_argument("--kept-share", type=float, default=0.1, help="share of reports marked kept for gather")
    args = ap.parse_args(argv)
    copies = -(-args.candidates // PER_COPY)
    with tempfile.TemporaryDirectory(prefix="sweflow-bench-smith-") as tmp:
        tmp = Path(tmp)
        t = time.monotonic()
        repo, commit = synthetic_repo(tmp, copies)
        print(f"synthetic repository: {copies} copies of calclib in {time.monotonic() - t:.1f} s")
        (tmp / "shards").mkdir()
        cands = bench_generation(repo, commit, args.shards, tmp / "shards")[: args.candidates]
        bench_dag(args.shards, tmp)
        bench_gather(cands, tmp, repo, commit, args.kept_share)
        if args.validate:
            bench_validation(args.validate, tmp)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
