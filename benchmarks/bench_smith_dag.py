"""Benchmark: SWE-smith through the real sharded Snakemake DAG at 50,000 candidates, with a fake test runner.

    .venv/bin/python benchmarks/bench_smith_dag.py                              # 50,000 candidates, 100 shards
    .venv/bin/python benchmarks/bench_smith_dag.py --candidates 5000 --shards 10 [--cores 2] [--workdir DIR]

Snakemake runs the smith branch for real (runtime wheel -> repo_env -> bug_candidates per shard ->
validate_candidates per shard -> gather_tasks -> problem_statements -> smith_dataset) over a synthetic
repository (the sample package copied K times, see bench_smith.py) with the procedural strategy only.

The fake runner stays out of production code: this script writes a `sitecustomize.py` into the work folder
and puts that folder on PYTHONPATH for the snakemake process only (its `script:` jobs are subprocesses that
inherit the environment). An import hook there replaces, once each module is loaded,

- `sweflow.smith.bug_validation.run_suite` (the one function that starts a sandbox and runs the suite, for the
  reference run and every candidate): instead it builds the pytest `-rA` log the sandbox would have
  returned, for a fixed suite of `--suite-tests` test ids spread over the repository's real test files,
  and parses it with the configured harness parser; a candidate breaks two tests (-> kept) when the
  sha256 of its diff falls in the first `--kept-share`, otherwise none (-> no_fail_to_pass);
- `sweflow.smith.env.build_environment` (the template build: bubblewrap, venvs, pip): a fixed record.

Everything else (reading shards, grading and writing reports, provenance, gather's commits, the scripted
LM's statements, the parquet) runs for real. Each job's wall and CPU seconds are recorded by the same
sitecustomize (at exit) and summed per rule.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_smith import PER_COPY, synthetic_repo  # noqa: E402

from sweflow.smith.gitrepo import is_test_path, tracked_files  # noqa: E402

PROFILE = "big"
DATASET = "smith-bench"

SITECUSTOMIZE = r'''
"""Benchmark only (written by benchmarks/bench_smith_dag.py): a fake suite runner and per-job timing."""
import atexit
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import resource
import sys
import time

_T0 = time.time()
_CONF = __CONF__
_STATE = {"fake_runs": 0}


def _suite():
    if "suite" not in _STATE:
        with open(_CONF["suite_file"]) as f:
            _STATE["suite"] = json.load(f)
    return _STATE["suite"]


def _fake_run_suite(provider, template, profile, commit, *, parser, patch="", runs=2, timeout=None):
    from sweflow.harness import driver
    from sweflow.smith.bug_validation import SuiteResult, SuiteRun

    suite = _suite()
    broken = set()
    if patch.strip():
        h = int(hashlib.sha256(patch.encode("utf-8")).hexdigest()[:12], 16)
        if h % 1000 < _CONF["kept_per_mille"]:
            broken = {suite[(h >> 10) % len(suite)], suite[(h >> 30) % len(suite)]}
    lines = ["============================= test session starts =============================="]
    for t in sorted(broken):
        lines += [f"___ {t.split('::')[-1]} ___", "    def test():", ">       assert compute(3) == 4",
                  "E       assert 3 == 4", "E        +  where 3 = compute(3)"]
    lines.append("=========================== short test summary info ============================")
    lines += [f"{'FAILED' if t in broken else 'PASSED'} {t}" + (" - assert 3 == 4" if t in broken else "")
              for t in suite]
    lines.append(f"======================= {len(broken)} failed, {len(suite) - len(broken)} passed in 1.00s "
                 "=======================")
    text = "\n".join(lines) + "\n"
    out = []
    for _ in range(runs):
        statuses = driver.call_parser(parser, text, None)
        out.append(SuiteRun(dict(statuses), 1 if broken else 0, False, 0.0, text[-3000:]))
    _STATE["fake_runs"] += runs
    return SuiteResult(out)


def _fake_build_environment(provider, provider_name, profile, bare, commit, *, settings, wheel=None):
    image = profile.env_image(commit)
    return {"image": image, "provider": provider_name, "template": "bench-fake-" + commit[:12],
            "spec_hash": "0" * 16, "build_id": "0" * 16, "extra": {}, "ok": True}


def _patch_validate(module):
    module.run_suite = _fake_run_suite


def _patch_env(module):
    module.build_environment = _fake_build_environment


_PATCHES = {"sweflow.smith.bug_validation": _patch_validate, "sweflow.smith.env": _patch_env}


class _PatchFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            _PATCHES[name](module)

        spec.loader.exec_module = patched
        return spec


sys.meta_path.insert(0, _PatchFinder())


def _job():
    argv0 = sys.argv[0] if sys.argv else ""
    if "/.snakemake/scripts/" in argv0:
        return os.path.basename(argv0).split(".", 1)[-1].removesuffix(".py")
    if argv0.endswith(os.path.join("snakemake", "__main__.py")):
        return "(snakemake)"
    return None


def _record():
    job = _job()
    if job is None:
        return
    ru = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)  # git and other subprocesses (finished ones)
    rec = {"job": job, "pid": os.getpid(), "start": _T0, "end": time.time(), "cpu": ru.ru_utime + ru.ru_stime,
           "child_cpu": ch.ru_utime + ch.ru_stime, "fake_runs": _STATE["fake_runs"],
           "maxrss_mb": ru.ru_maxrss / 1024}
    with open(_CONF["timings_file"], "a") as f:
        f.write(json.dumps(rec) + "\n")


atexit.register(_record)
'''


def write_fake(work: Path, repo: Path, suite_tests: int, kept_share: float) -> dict:
    """The fake suite (test ids over the repository's real test files) and the sitecustomize folder."""
    tests = [f for f in tracked_files(repo, "HEAD") if is_test_path(f) and f.endswith(".py")]
    suite = [f"{tests[i % len(tests)]}::test_case_{i}" for i in range(suite_tests)]
    fake = work / "fake"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "suite.json").write_text(json.dumps(suite))
    conf = {
        "suite_file": str(fake / "suite.json"),
        "timings_file": str(fake / "timings.jsonl"),
        "kept_per_mille": round(kept_share * 1000),
    }
    (fake / "sitecustomize.py").write_text(SITECUSTOMIZE.replace("__CONF__", repr(conf)).lstrip())
    return conf


def write_config(work: Path, repo: Path, shards: int, parallel: int) -> Path:
    cfg = {
        "dataset": {"name": DATASET, "source": "smith", "hub": {"endpoint": None}},
        "harness": {"package": "swebench", "extra_repos": "sample"},
        "sandbox": {"provider": "local", "local": {"templates_root": str(work / "templates")}},
        "smith": {
            "enabled": True,
            "dataset": DATASET,
            "repos": [{"name": PROFILE, "repo": "bench/big", "source": str(repo)}],
            "strategies": {
                "procedural": {"shards": shards, "per_entity": 3},
                "lm_modify": {"enabled": False},
                "lm_rewrite": {"enabled": False},
                "pr_mirror": {"enabled": False},
                "combine": {"enabled": False},
            },
            "validation": {"runs": 2, "attempts": 2, "parallel": parallel},
            "statements": {"shards": max(1, shards // 10)},
            "lm": {"endpoint": "scripted"},
        },
    }
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def snakemake(work: Path, fake: Path, cores: int, *extra: str) -> tuple[float, subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if k != "SWEFLOW_LEDGER_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(fake), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory",
           str(work / "run"), "--configfile", str(work / "config.yaml"), "--workflow-profile", "none",
           "--cores", str(cores), f"results/smith/{PROFILE}/summary.json",
           f"resources/datasets/{DATASET}/train.parquet", *extra]  # fmt: skip
    t = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.monotonic() - t
    if res.returncode != 0:
        sys.exit(f"snakemake failed ({' '.join(extra)}):\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}")
    return dt, res


def job_table(text: str) -> dict[str, int]:
    """The dry run's `Job stats` table: rule -> count (and total)."""
    table = {}
    for ln in text.splitlines():
        parts = ln.split()
        if len(parts) == 2 and parts[1].isdigit() and re.fullmatch(r"[A-Za-z_]\w*", parts[0]):
            table[parts[0]] = int(parts[1])
    return table


def per_rule(timings: Path) -> tuple[dict[str, dict], dict[str, float]]:
    """Per rule: jobs, wall, CPU, longest job, peak RSS, fake suite runs; and the snakemake process's
    phases: start -> first job (parse, DAG, onstart), time with no job running, last job -> exit."""
    rows = [json.loads(ln) for ln in timings.read_text().splitlines() if ln.strip()]
    out: dict[str, dict] = defaultdict(
        lambda: {"jobs": 0, "wall": 0.0, "cpu": 0.0, "child": 0.0, "max": 0.0, "rss": 0.0, "fake": 0}
    )
    for r in rows:
        d = out[r["job"]]
        wall = r["end"] - r["start"]
        d["jobs"] += 1
        d["wall"] += wall
        d["cpu"] += r["cpu"]
        d["child"] += r["child_cpu"]
        d["max"] = max(d["max"], wall)
        d["rss"] = max(d["rss"], r["maxrss_mb"])
        d["fake"] += r["fake_runs"]
    main = next(r for r in rows if r["job"] == "(snakemake)")
    jobs = sorted((r["start"], r["end"]) for r in rows if r["job"] != "(snakemake)")
    idle, reach = 0.0, jobs[0][0]
    for a, b in jobs:
        idle += max(0.0, a - reach)
        reach = max(reach, b)
    phases = {"startup": jobs[0][0] - main["start"], "idle": idle, "tail": main["end"] - reach}
    return dict(out), phases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=50000)
    ap.add_argument("--shards", type=int, default=100)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=1, help="smith.validation.parallel (threads per job)")
    ap.add_argument("--suite-tests", type=int, default=1000, help="tests in the fake suite")
    ap.add_argument("--kept-share", type=float, default=0.1, help="share of candidates that break tests")
    ap.add_argument("--workdir", type=Path, help="keep everything here (default: a temporary folder)")
    args = ap.parse_args(argv)
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="sweflow-bench-smith-dag-")
        args.workdir = Path(tmp.name)
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    copies = -(-args.candidates // PER_COPY)
    t = time.monotonic()
    repo, _ = synthetic_repo(work / "repo", copies)
    print(f"synthetic repository: {copies} copies of calclib in {time.monotonic() - t:.1f} s; fake suite "
          f"{args.suite_tests} tests, kept share {args.kept_share}; cores {args.cores}, "
          f"validation.parallel {args.parallel}; workdir {work}")  # fmt: skip
    conf = write_fake(work, repo, args.suite_tests, args.kept_share)
    write_config(work, repo, args.shards, args.parallel)
    fake = work / "fake"

    plan, res = snakemake(work, fake, args.cores, "-n", "--quiet", "rules")
    table = job_table(res.stdout + res.stderr)
    print(f"DAG: {table.get('total')} jobs planned in {plan:.1f} s (dry run, a cold start)")
    print("  " + ", ".join(f"{k} {v}" for k, v in table.items() if k != "total"))

    Path(conf["timings_file"]).unlink(missing_ok=True)
    wall, res = snakemake(work, fake, args.cores)
    done = len(re.findall(r"^Finished jobid: \d+", res.stdout + res.stderr, re.M))
    summary = json.loads((work / "run" / "results" / "smith" / PROFILE / "summary.json").read_text())
    ds = json.loads((work / "run" / "results" / "smith" / f"{DATASET}.dataset.json").read_text())
    n = summary["candidates"]
    rules, phases = per_rule(Path(conf["timings_file"]))
    Path(conf["timings_file"]).unlink()
    vdir = work / "run" / "results" / "smith" / PROFILE / "validation"
    rep_bytes = sum(f.stat().st_size for f in vdir.rglob("*.jsonl"))
    seconds = [json.loads(ln)["seconds"] for f in vdir.rglob("*.jsonl") for ln in f.open()]
    print(f"run: {done} jobs in {wall:.1f} s wall; {n} candidates -> {summary['tasks']} tasks -> "
          f"{ds['rows']} dataset rows; {wall / n * 1000:.2f} ms wall per candidate")  # fmt: skip
    print(f"  validation reports {rep_bytes / 1e6:.1f} MB ({rep_bytes / n / 1e3:.1f} kB per candidate); "
          f"in-process validation {sum(seconds) / n * 1000:.2f} ms per candidate (fake suite run + grading)")  # fmt: skip
    head = ("rule", "jobs", "wall s", "cpu s", "sub cpu", "max s", "share", "rss MB", "fake")
    print(f"  {head[0]:<22}" + "".join(f"{h:>8}" for h in head[1:]))
    busy = sum(d["wall"] for k, d in rules.items() if k != "(snakemake)")
    for k, d in sorted(rules.items(), key=lambda kv: -kv[1]["wall"]):
        share = f"{d['wall'] / busy:.0%}" if k != "(snakemake)" else ""
        print(f"  {k:<22}{d['jobs']:>8}{d['wall']:>8.1f}{d['cpu']:>8.1f}{d['child']:>8.1f}{d['max']:>8.1f}"
              f"{share:>8}{d['rss']:>8.0f}{d['fake']:>8}")  # fmt: skip
    print(f"  jobs' wall summed {busy:.1f} s ({busy / wall:.2f} jobs running on average); snakemake alone: "
          f"{phases['startup']:.1f} s to the first job (parse, DAG, onstart), {phases['idle']:.1f} s with no "
          f"job running, {phases['tail']:.1f} s after the last job (onsuccess)")  # fmt: skip

    noop, res = snakemake(work, fake, args.cores)
    nothing = "Nothing to be done" in res.stdout + res.stderr
    print(f"no-op rerun: {noop:.1f} s ({'nothing to be done' if nothing else 'JOBS RAN'})")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
