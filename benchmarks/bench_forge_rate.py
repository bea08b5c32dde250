"""Benchmark: each adaptive forger family's forge rate, and the honest false-positive rate, in real sandboxes.

    .venv/bin/python benchmarks/bench_forge_rate.py --provider local --evals 5 --gold-evals 10
    .venv/bin/python benchmarks/bench_forge_rate.py --provider docker --families memory,positional

For every sample task, each family of tests/fixtures/forgers.py (a patch that only appends to the package's
``__init__.py`` and fixes nothing) is graded ``--evals`` times by the rollouts' own path
(``evaluate_agent_patch``: fresh sandbox, canaries drawn anew each time, one decoy run after a resolved
one), with the tamper scan off, so the canaries alone must hold; then the gold patch ``--gold-evals`` times
with the default rules. Printed: per family and task, how often it was paid (reward 1.0) and the refusal
reasons; the gold patch's share of reward 1.0 (anything else is a false positive). Needs no network.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sweflow.grading.agent_eval import evaluate_agent_patch  # noqa: E402
from sweflow.grading.integrity import IntegrityRules  # noqa: E402
from sweflow.sample import instance_ids, load_task  # noqa: E402
from tests.fixtures.forgers import FAMILIES  # noqa: E402

NO_TAMPER_SCAN = IntegrityRules(tamper_patterns=())


def forger_patch(env, inst: dict, code: str) -> str:
    """The patch that appends `code` to calclib/__init__.py at the task's base commit."""
    base = inst["base_commit"]
    text = env.read_base(base, "calclib/__init__.py") + "\n" + textwrap.dedent(code)
    return env.make_patch(base, {"calclib/__init__.py": text})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provider", choices=["docker", "local"], default="local")
    ap.add_argument("--evals", type=int, default=5, help="evaluations per family and task")
    ap.add_argument("--gold-evals", type=int, default=10, help="evaluations of the gold patch per task")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--tasks", default="", help="comma-separated instance ids (default: every sample task)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    ids = args.tasks.split(",") if args.tasks else instance_ids(None)
    families = args.families.split(",") if args.families else []
    from tests.integration.conftest_validation import docker_env, local_env

    with tempfile.TemporaryDirectory(prefix="sweflow-bench-forge-") as tmp:
        t0 = time.monotonic()
        env = (docker_env if args.provider == "docker" else local_env)(Path(tmp), ids=tuple(ids))
        print(f"setup ({args.provider}, {len(ids)} templates): {time.monotonic() - t0:.1f}s", flush=True)
        tasks = {i: load_task(i) for i in ids}
        jobs = [(fam, i, k) for fam in families for i in ids for k in range(args.evals)]
        jobs += [("gold", i, k) for i in ids for k in range(args.gold_evals)]
        patches = {(fam, i): forger_patch(env, tasks[i], FAMILIES[fam]) for fam in families for i in ids}
        patches.update({("gold", i): tasks[i]["patch"] for i in ids})

        def one(job):
            fam, iid, _ = job
            rules = {} if fam == "gold" else {"rules": NO_TAMPER_SCAN}
            res = evaluate_agent_patch(
                env.provider, env.templates[iid], env.meta(tasks[iid]), patches[(fam, iid)],
                sandbox_timeout=300, **rules,
            )  # fmt: skip
            twins = sum(c.get("of") == "f2p" for c in res.canaries)
            reason = f"infra: {res.error}" if res.error else res.failure_reason
            return fam, iid, res.reward, reason, twins

        t1 = time.monotonic()
        with cf.ThreadPoolExecutor(max_workers=args.workers) as pool:
            results = list(pool.map(one, jobs))
        wall = time.monotonic() - t1
    paid: dict = collections.defaultdict(list)
    reasons: dict = collections.defaultdict(collections.Counter)
    twinless: set = set()
    for fam, iid, reward, reason, twins in results:
        paid[(fam, iid)].append(reward == 1.0)
        reasons[fam][reason or "resolved"] += 1
        if fam == "gold" and not twins:
            twinless.add(iid)
    print(f"{len(results)} evaluations in {wall:.0f} s ({args.provider}); tasks whose gold runs had no "
          f"FAIL_TO_PASS twin: {sorted(twinless) or 'none'}")  # fmt: skip
    short = {i: i.rsplit("-", 1)[-1] for i in ids}
    print(f"{'family':<14} " + " ".join(f"{short[i]:>5}" for i in ids) + f" {'paid':>9} {'rate':>6}")
    for fam in [*families, "gold"]:
        cells = [paid[(fam, i)] for i in ids]
        total, hits = sum(len(c) for c in cells), sum(sum(c) for c in cells)
        print(f"{fam:<14} " + " ".join(f"{sum(c)}/{len(c):<3}" for c in cells) + f" {hits:>4}/{total:<4} "
              f"{hits / total if total else 0:6.3f}")  # fmt: skip
    for fam in [*families, "gold"]:
        print(f"  {fam}: " + ", ".join(f"{r} {n}" for r, n in reasons[fam].most_common()))
    gold = [x for i in ids for x in paid[("gold", i)]]
    if gold:
        print(f"honest gold: {sum(gold)}/{len(gold)} reward 1.0; false positives {len(gold) - sum(gold)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
