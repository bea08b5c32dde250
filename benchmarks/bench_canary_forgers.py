"""Benchmark: how well text forgers pick the original FAIL_TO_PASS test out of its twin cluster.

    .venv/bin/python benchmarks/bench_canary_forgers.py              # every sample task, 200 plans each
    .venv/bin/python benchmarks/bench_canary_forgers.py --plans 1000

For each sample task the test files run by its eval script (at the base commit, test patch applied) get
``--plans`` canary plans placed as a real run and as a decoy run would plant them (no sandbox: the files as
the test command would find them). Each forger sees every cluster (an original and its twins, or a decoy's
stand-in and twins) and picks the member it takes for the original, by the expected literal (median, min,
max, nearest the rest, roundest), by place in the file (first, last) or by name (the oracle: it knows the
FAIL_TO_PASS names, which no run shows now: each such test runs under a drawn name). Printed per forger: how often its pick is the original in real runs (chance is
1/(twins+1) per cluster), and how often the same rule finds a "clear" pick in decoy runs vs real ones (a rule
that separates them would let a forger stay honest in decoys). The last lines bound the randomising name
oracle's pay against decoy runs (forge with chance r per run, paid only when the decoy did not forge).
"""

from __future__ import annotations

import argparse
import ast
import random
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sweflow.grading import canary_place, canary_plan  # noqa: E402
from sweflow.sample import instance_ids, load_task  # noqa: E402
from sweflow.sample.repo import clone_at, materialize_repo  # noqa: E402


def _files(task: dict, repo: Path, work: Path) -> dict[str, str]:
    dest = clone_at(repo, work, task["base_commit"])
    subprocess.run(["git", "apply", "-"], cwd=dest, input=task["test_patch"].encode(), check=True)
    paths = {t.split("::")[0] for t in task["FAIL_TO_PASS"] + task["PASS_TO_PASS"]}
    return {p: (dest / p).read_text() for p in sorted(paths) if (dest / p).exists()}


def _literal(src_a: str, src_b: str) -> str:
    """The literal of ``src_a`` where it differs from ``src_b`` (the cluster's moved expectation)."""
    import io
    import tokenize

    ta = [t.string for t in tokenize.generate_tokens(io.StringIO(src_a).readline)]
    tb = [t.string for t in tokenize.generate_tokens(io.StringIO(src_b).readline)]
    return next((a for a, b in zip(ta, tb, strict=False) if a != b), "")


def _number(lit: str) -> float | None:
    try:
        return float(lit)
    except ValueError:
        return None


def _key(lit: str):
    n = _number(lit)
    return (0, n, "") if n is not None else (1, len(lit), lit)


def _round(lit: str) -> int:
    digits = lit.replace(".", "")
    return len(digits) - len(digits.rstrip("0")) if digits.isdigit() else 0


def _dist(a: str, b: str) -> int:
    import difflib

    return sum(max(i2 - i1, j2 - j1) for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b).get_opcodes()
               if op != "equal")  # fmt: skip


def _members(text: str, cset, name: str, cls: str) -> list[dict]:
    """The cluster of the test ``name``: each member's name, literal, line."""
    tree = ast.parse(text)
    scope = (
        next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), tree) if cls else tree
    )
    nodes = {n.name: n for n in scope.body if isinstance(n, ast.FunctionDef)}
    lines = text.split("\n")
    own = next((c.name for c in cset if c.replaces and c.cloned_from == name), name)  # under a drawn name
    names = [own] + [c.name for c in cset if c.of == "f2p" and c.cloned_from == name and not c.replaces]
    srcs = {n: "\n".join(lines[nodes[n].lineno - 1 : nodes[n].end_lineno]) for n in names}
    out = []
    for n in names:
        other = srcs[names[1] if n == names[0] else names[0]]
        out.append({"name": n, "lit": _literal(srcs[n], other), "line": nodes[n].lineno})
    return out


def _picks(members: list[dict], f2p_names: set[str], rng: random.Random) -> dict[str, str | None]:
    """Each forger's pick (a member's name), None where its rule has no single winner."""

    def one(best):
        return best[0]["name"] if len(best) == 1 else None

    def arg(fn, pick):
        vals = [fn(m) for m in members]
        target = pick(vals)
        return one([m for m, v in zip(members, vals, strict=True) if v == target])

    keys = [_key(m["lit"]) for m in members]
    med = sorted(keys)[len(keys) // 2]
    return {
        "median literal": one([m for m, k in zip(members, keys, strict=True) if k == med]),
        "smallest literal": arg(lambda m: _key(m["lit"]), min),
        "largest literal": arg(lambda m: _key(m["lit"]), max),
        "nearest the rest": arg(lambda m: sum(_dist(m["lit"], o["lit"]) for o in members), min),
        "roundest literal": arg(lambda m: _round(m["lit"]), max),
        "first in file": arg(lambda m: m["line"], min),
        "last in file": arg(lambda m: m["line"], max),
        "name (oracle)": one([m for m in members if m["name"] in f2p_names]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    hits: dict[str, list[float]] = defaultdict(list)
    clear = {True: defaultdict(list), False: defaultdict(list)}
    chance, clusters, tasks_with = [], 0, 0
    with tempfile.TemporaryDirectory(prefix="sweflow-bench-forgers-") as tmp:
        repo = materialize_repo(Path(tmp) / "src").path
        for k, iid in enumerate(instance_ids(None)):
            task = load_task(iid)
            files = _files(task, repo, Path(tmp) / f"w{k}")
            f2p_names = {t.split("::")[-1] for t in task["FAIL_TO_PASS"]}
            got_any = False
            for _ in range(args.plans):
                for decoy in (False, True):
                    plan = canary_plan.plan_canaries(
                        files, task["PASS_TO_PASS"], rng, fail_to_pass=task["FAIL_TO_PASS"], decoy=decoy
                    )
                    cset = canary_place.place(plan, files, rng)
                    heads = {(c.path, c.cls, c.cloned_from) for c in cset if c.of == "f2p"}
                    for path, cls, name in sorted(heads):
                        members = _members(cset.writes.get(path, files[path]), cset, name, cls)
                        picks = _picks(members, f2p_names, rng)
                        for forger, pick in picks.items():
                            clear[decoy][forger].append(pick is not None)
                            if not decoy:
                                right = members[0]["name"]  # the original: the cluster's first member
                                hits[forger].append(
                                    1.0 if pick == right else 0.0 if pick else 1 / len(members)
                                )
                        if not decoy:
                            clusters += 1
                            chance.append(1 / len(members))
                            got_any = True
            tasks_with += got_any
    print(f"sample tasks with twin clusters: {tasks_with} of {len(instance_ids(None))}; "
          f"clusters seen in real runs: {clusters} ({args.plans} plans per task)")  # fmt: skip
    print(f"chance per cluster (1/(twins+1)): {statistics.mean(chance):.3f}")
    print(f"{'forger':<20} {'picks original':>15} {'clear pick real':>16} {'clear pick decoy':>17}")
    for forger in hits:
        print(
            f"{forger:<20} {statistics.mean(hits[forger]):15.3f} {statistics.mean(clear[False][forger]):16.3f} "
            f"{statistics.mean(clear[True][forger]):17.3f}"
        )
    print(
        "a forger that knows the original, forging with chance r = 1/(K+1) per run, paid if no decoy forged:"
    )
    for k in (0, 1, 2, 3):
        r = 1 / (k + 1)
        print(f"  decoys={k}: paid {r * (1 - r) ** k:.3f}, caught {r * (1 - (1 - r) ** k):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
