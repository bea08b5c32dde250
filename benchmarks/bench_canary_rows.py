"""Benchmark: canary coverage on real rows, each at its own base commit, old planner vs new.

    .venv/bin/python benchmarks/bench_canary_rows.py --mirror /work/.mirror --per-project 4
    .venv/bin/python benchmarks/bench_canary_rows.py A.git B.git --per-project 6 --old-rev 5731f48

A row is what SWE-bench and SWE-Gym make of a merged fix: a commit of the project's history that changes
source files and test files (the projects SWE-Gym draws from, mirrored as ``fetch`` lays them out:
``DIR/owner+name/repo``). Base commit = its parent, test patch = its test-file changes, FAIL_TO_PASS = the
test functions it adds or changes (parametrized ones as ``name[x]``), PASS_TO_PASS = the other tests of those
files. The test files as a run sees them (base + test patch: the commit's own) go to ``plan_canaries`` with
those ids, as ``evaluate_patch`` plans them. Per row: guarded (a must-fail PASS_TO_PASS canary or a
FAIL_TO_PASS twin), with twins (GRPO trains only on these by default), unguarded (validation's verdict: no
canary). Rows are drawn evenly over each project's last ``--history`` commits that qualify. No network.
"""

from __future__ import annotations

import argparse
import ast
import collections
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_canary_coverage import TEST_DIRS, defined_tests, git, load_old, why_not  # noqa: E402

from sweflow.grading import canary_plan as new  # noqa: E402
from sweflow.grading.canary import F2P, MUST_FAIL, P2P  # noqa: E402


def is_test_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return (
        path.endswith(".py")
        and bool(TEST_DIRS & set(path.split("/")[:-1]))
        and (name.startswith("test_") or name.endswith("_test.py"))
    )


def candidate_commits(gd: Path, history: int) -> list[tuple[str, list[str]]]:
    """(commit, its test files) for commits among the last `history` that change source and tests."""
    out = ""
    while history >= 25 and not out:  # a mirror may lack old objects: walk less history
        res = subprocess.run(
            ["git", f"--git-dir={gd}", "log", "--no-merges", f"-n{history}", "--format=@%H", "--name-only",
             "--diff-filter=AM", "HEAD"], capture_output=True,
        )  # fmt: skip
        out, history = (res.stdout.decode("utf-8", "replace") if res.returncode == 0 else ""), history // 4
    found, sha, files = [], None, []
    for line in [*out.splitlines(), "@"]:
        if line.startswith("@"):
            tests = [f for f in files if is_test_file(f)]
            source = [
                f
                for f in files
                if f.endswith(".py") and not is_test_file(f) and "test" not in f.split("/")[0]
            ]
            if sha and tests and source and len(tests) <= 3:
                found.append((sha, tests))
            sha, files = line[1:] or None, []
        elif line.strip():
            files.append(line.strip())
    return found


def _tests(text: str) -> dict[str, tuple[str, bool]]:
    """test id (file-relative: ``Class::name`` or ``name``) -> (its source dump, parametrized)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return {}
    return {"::".join(filter(None, [cls, fn.name])): (ast.dump(fn), p) for cls, fn, p in defined_tests(tree)}


def make_row(gd: Path, sha: str, tests: list[str]) -> dict | None:
    """The row SWE-bench would make of `sha` (see the module docstring), or None if it adds no test."""
    files, f2p, p2p = {}, [], []
    for path in tests:
        after = git(gd, "show", f"{sha}:{path}")
        res = subprocess.run(["git", f"--git-dir={gd}", "show", f"{sha}^:{path}"], capture_output=True)
        before = res.stdout.decode("utf-8", "replace") if res.returncode == 0 else ""  # a new test file
        files[path] = after
        old, now = _tests(before), _tests(after)
        for tid, (dump, param) in now.items():
            ident = f"{path}::{tid}" + ("[x]" if param else "")
            (p2p if tid in old and old[tid][0] == dump else f2p).append(ident)
    return {"commit": sha, "files": files, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p} if f2p else None


def twinless_why(row: dict) -> collections.Counter:
    """Why the new planner gives this row's FAIL_TO_PASS tests no twins (bench_canary_coverage.why_not)."""
    why: collections.Counter = collections.Counter()
    wanted = {t.split("[")[0] for t in row["FAIL_TO_PASS"]}
    for path, text in row["files"].items():
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        plain = new._plain_tests(tree, docstrings=True, params=True)
        for cls, fn, param in defined_tests(tree):
            if f"{path}::{'::'.join(filter(None, [cls, fn.name]))}" in wanted:
                why[why_not(fn, cls, plain, param)] += 1
    return why


def cover(mod, row: dict, seed: int) -> str:
    """'twins', 'p2p' (a must-fail PASS_TO_PASS canary, no twin) or 'none' for `row` under planner `mod`."""
    try:
        plan = mod.plan_canaries(
            row["files"], row["PASS_TO_PASS"], random.Random(seed), fail_to_pass=row["FAIL_TO_PASS"]
        )
    except Exception as e:  # noqa: BLE001 - counted as no canary, the benchmark goes on
        print(f"  planner crashed on {row['commit'][:10]}: {e!r}", file=sys.stderr)
        return "none"
    if any(c.of == F2P and c.expect == MUST_FAIL and not getattr(c, "replaces", None) for c in plan):
        return "twins"
    return "p2p" if any(c.of == P2P and c.expect == MUST_FAIL for c in plan) else "none"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gitdirs", nargs="*", type=Path)
    ap.add_argument("--mirror", type=Path, help="every DIR/*/repo")
    ap.add_argument("--per-project", type=int, default=4)
    ap.add_argument("--history", type=int, default=3000, help="commits of each project to draw rows from")
    ap.add_argument(
        "--old-rev", default="5731f48", help="the planner to compare with (a commit of this repo)"
    )
    ap.add_argument("--seeds", type=int, default=3, help="plans per row (a row counts when most plans agree)")
    args = ap.parse_args(argv)
    dirs = list(args.gitdirs)
    if args.mirror:
        dirs += sorted(p for p in args.mirror.glob("*/repo") if p.is_dir())
    old = load_old(args.old_rev)
    totals: dict = collections.Counter()
    whys: collections.Counter = collections.Counter()
    print(
        f"{'project':<28} {'rows':>4} | {'old: twins':>10} {'guarded':>8} | {'new: twins':>10} {'guarded':>8}"
    )
    t0 = time.monotonic()
    for gd in dirs:
        name = gd.parent.name if gd.name == "repo" else gd.stem
        cands = candidate_commits(gd, args.history)
        rows: list[dict] = []
        step = max(1, len(cands) // max(1, args.per_project * 3))
        for sha, tests in cands[::step]:
            try:
                row = make_row(gd, sha, tests)
            except subprocess.CalledProcessError:  # an object the mirror lacks
                row = None
            if row:
                rows.append(row)
            if len(rows) >= args.per_project:
                break
        if not rows:
            continue
        c: dict = collections.Counter()
        for row in rows:
            for tag, mod in (("old", old), ("new", new)):
                got = collections.Counter(cover(mod, row, s) for s in range(args.seeds)).most_common(1)[0][0]
                c[f"{tag}_{got}"] += 1
                if tag == "new" and got != "twins":
                    whys.update(twinless_why(row))
            totals["rows"] += 1
        for k, v in c.items():
            totals[k] += v
        n = len(rows)
        print(f"{name:<28} {n:>4} | {c['old_twins']:>10} {n - c['old_none']:>8} | "
              f"{c['new_twins']:>10} {n - c['new_none']:>8}")  # fmt: skip
    n = totals["rows"]
    if not n:
        print("no rows found")
        return 1
    print(f"{'all':<28} {n:>4} | {totals['old_twins']:>10} {n - totals['old_none']:>8} | "
          f"{totals['new_twins']:>10} {n - totals['new_none']:>8}   ({time.monotonic() - t0:.0f} s)")  # fmt: skip
    print("why the FAIL_TO_PASS tests of rows without twins get none (new planner), tests:")
    for why, k in whys.most_common(12):
        print(f"  {k:>4}  {why}")
    for tag in ("old", "new"):
        print(f"{tag}: guarded {100 * (n - totals[f'{tag}_none']) / n:.1f}% of {n} rows; with FAIL_TO_PASS twins "
              f"(trained on by GRPO) {100 * totals[f'{tag}_twins'] / n:.1f}%; unguarded (validation leaves "
              f"them out) {100 * totals[f'{tag}_none'] / n:.1f}%")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
