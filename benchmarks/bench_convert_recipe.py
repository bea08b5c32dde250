"""convert against the recipe's own converter, paired whole-process runs on the same SWE-Gym-shaped parquet.

The recipe's converter (whisper-la/Dressage `examples/data/swegym/prepare_swegym_data.py`) is not shipped
here: pass its path. Both sides use the real SWE-Gym harness at the pinned commit 16dd480cce9b (a checkout of
SWE-Gym/SWE-Bench-Package, passed as `--swegym-root`; the converter's own `--swegym-package-root`). The rows
are SkyRL-shaped (`instance` structs), one per instance over seven of SWE-Gym's repositories in its
proportions (REPOS says why not all eleven), with versions from the harness's spec table and sizes like SWE-Gym's (statements, patches,
test lists). After one unmeasured run of each, each pair runs the two in turn (order alternating); it reports per side the median wall time
and the peak resident memory of the whole process tree (sampled every 10 ms), and the paired ratios.

    .venv/bin/python benchmarks/bench_convert_recipe.py --converter PATH --swegym-root DIR [--rows 2438]
        [--pairs 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from bench_convert import CONVERT_RUNNER, JSONL, PARAMS, PARQUET, prepare, sha256  # noqa: E402

# SWE-Gym's repositories as it spells them, with roughly their share of its 2,438 instances. Left out:
# pandas, dask, modin and bokeh, whose eval scripts the harness builds from each commit's environment.yml,
# fetched from GitHub per row (no network here; with one, both converters wait for the same fetches).
REPOS = {
    "getmoto/moto": 600, "python/mypy": 290, "iterative/dvc": 290, "Project-MONAI/MONAI": 120,
    "conan-io/conan": 90, "pydantic/pydantic": 70, "facebookresearch/hydra": 20,
}  # fmt: skip
WORDS = "the a value when index frame returns raises error should type None column with of to is in".split()

# The recipe's converter, run as its own `main` would be, with its split-size check set to the row count
# (it accepts only 293 or 23 rows) and its e2b image map made from its own naming.
RECIPE_RUNNER = """
import importlib.util, json, sys
conv, parquet, root, out, n = sys.argv[1:6]
spec = importlib.util.spec_from_file_location("recipe_converter", conv)
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
mod.EXPECTED_SPLIT_SIZES["train"] = int(n)
sys.exit(mod.main([out, "--input", parquet, "--swegym-package-root", root, "--provider", "e2b",
                   "--sandbox-image-map", "recipe-image-map.json"]))
"""


def _text(rng: random.Random, chars: int) -> str:
    out, n = [], 0
    while n < chars:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


def _diff(path: str, rng: random.Random, lines: int) -> str:
    body = "".join(f"+    assert {_text(rng, 40).replace(' ', '_')} is not None\n" for _ in range(lines))
    return (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -10,3 +10,{3 + lines} @@\n"
            f" def test_base():\n{body}     pass\n")  # fmt: skip


def swegym_rows(n: int, specs: dict, seed: int = 0) -> list[dict]:
    """`n` SkyRL-shaped rows over SWE-Gym's repositories (deterministic for a seed)."""
    rng = random.Random(seed)
    total = sum(REPOS.values())
    repos = [r for r, w in REPOS.items() for _ in range(max(1, round(w * n / total)))][:n]
    while len(repos) < n:
        repos.append("getmoto/moto")
    rows = []
    for i, repo in enumerate(repos):
        versions = sorted(specs[repo.lower()] if repo.lower() in specs else specs[repo])
        owner, name = repo.split("/")
        mod = name.lower()
        tests = [f"{mod}/tests/test_{rng.choice(WORDS)}_{k}.py::test_{_text(rng, 24).replace(' ', '_')}[{k}]"
                 for k in range(rng.choice([3, 20, 60, 150, 400]))]  # fmt: skip
        test_files = sorted({t.split("::")[0] for t in tests[:3]})
        instance = {
            "repo": repo,
            "instance_id": f"{owner}__{name}-{10000 + i}",
            "base_commit": f"{rng.getrandbits(160):040x}",
            "patch": _diff(f"{mod}/core/{rng.choice(WORDS)}.py", rng, rng.randint(3, 40)),
            "test_patch": "".join(_diff(f, rng, rng.randint(5, 60)) for f in test_files),
            "problem_statement": _text(rng, rng.randint(600, 6000)),
            "hints_text": _text(rng, rng.randint(0, 800)),
            "created_at": "2023-06-01T12:00:00Z",
            "version": rng.choice(versions),
            "FAIL_TO_PASS": tests[:2],  # lists, as SkyRL ships them (sweflow.sample.SKYRL_SCHEMA)
            "PASS_TO_PASS": tests[2:],
            "environment_setup_commit": f"{rng.getrandbits(160):040x}",
        }
        rows.append({"data_source": "swe-gym", "prompt": [{"role": "user", "content": instance["problem_statement"]}],
                     "env_class": "swe-gym", "instance": instance})  # fmt: skip
    return rows


def measured(cmd: list[str], cwd: Path, env: dict) -> tuple[float, float]:
    """Wall seconds and peak resident MiB of the whole process tree (children included, sampled)."""

    def tree_rss(pid: int) -> int:
        total, todo = 0, [pid]
        while todo:
            p = todo.pop()
            try:
                with open(f"/proc/{p}/statm") as f:
                    total += int(f.read().split()[1])
                for t in os.listdir(f"/proc/{p}/task"):
                    with open(f"/proc/{p}/task/{t}/children") as f:
                        todo += [int(c) for c in f.read().split()]
            except (FileNotFoundError, ProcessLookupError):
                pass
        return total * os.sysconf("SC_PAGE_SIZE")

    t = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.01)
    wall = time.perf_counter() - t
    out = proc.stdout.read()
    if proc.returncode != 0:
        sys.exit(f"{cmd[:3]} failed:\n{out[-3000:]}")
    return wall, peak / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--converter", type=Path, required=True, help="the recipe's prepare_swegym_data.py")
    ap.add_argument(
        "--swegym-root", type=Path, required=True, help="SWE-Bench-Package checkout at 16dd480cce9b"
    )
    ap.add_argument("--rows", type=int, default=2438)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="sweflow's convert workers")
    ap.add_argument("--workdir", type=Path)
    args = ap.parse_args()
    root = args.swegym_root.resolve()
    sys.path.insert(0, str(root))
    from swegym.harness.constants import MAP_REPO_VERSION_TO_SPECS

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-convert-recipe-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = swegym_rows(args.rows, MAP_REPO_VERSION_TO_SPECS)
    overlay = {
        "dataset": {"row_shape": "skyrl"},
        "images": {"prefix": "xingyaoww/sweb.eval.x86_64."},
        "harness": {"package": "swegym", "extra_repos": None},
    }
    prepare(workdir, rows, overlay)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(root)])}
    conv = str(args.converter.resolve())
    naming = ("import importlib.util, json, sys; s = importlib.util.spec_from_file_location('c', sys.argv[1]); "
              "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
              "rows = [r['instance'] for r in json.load(open(sys.argv[2]))]; "
              "json.dump({m.registry_image_for_instance(r['instance_id'], r['repo']): 'tpl-' + r['instance_id'] "
              "for r in rows}, open('recipe-image-map.json', 'w'))")  # fmt: skip
    (workdir / "rows.json").write_text(json.dumps(rows))
    subprocess.run([sys.executable, "-c", naming, conv, "rows.json"], cwd=workdir, env=env, check=True)
    sides = {
        "sweflow": [sys.executable, "-c", CONVERT_RUNNER, PARAMS, str(args.threads)],
        "recipe": [
            sys.executable,
            "-c",
            RECIPE_RUNNER,
            conv,
            PARQUET,
            str(root),
            "recipe.jsonl",
            str(args.rows),
        ],
    }
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
    for side in sides:  # one unmeasured run each: the page cache holds both sides' files from here on
        measured(sides[side], workdir, env)
    for i in range(args.pairs):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for side in order:
            runs[side].append(measured(sides[side], workdir, env))
    for side, rs in runs.items():
        walls = ", ".join(f"{w:.2f}" for w, _ in rs)
        print(f"{side:8s} wall s: {walls} (median {statistics.median(w for w, _ in rs):.2f}); peak MiB: "
              f"{', '.join(f'{m:.0f}' for _, m in rs)} (median {statistics.median(m for _, m in rs):.0f})")  # fmt: skip
    ratios = [s[0] / r[0] for s, r in zip(runs["sweflow"], runs["recipe"], strict=True)]
    mem = [s[1] / r[1] for s, r in zip(runs["sweflow"], runs["recipe"], strict=True)]
    print(
        f"paired wall ratio sweflow/recipe: {', '.join(f'{x:.2f}' for x in ratios)} "
        f"(median {statistics.median(ratios):.2f}); memory ratio median {statistics.median(mem):.2f}"
    )
    out_sw, out_re = workdir / JSONL, workdir / "recipe.jsonl"
    print(
        f"rows: sweflow {len(out_sw.read_text().splitlines())} ({out_sw.stat().st_size / 2**20:.1f} MiB, "
        f"sha256 {sha256(out_sw)[:12]}), recipe {len(out_re.read_text().splitlines())} "
        f"({out_re.stat().st_size / 2**20:.1f} MiB); input {(workdir / PARQUET).stat().st_size / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    main()
