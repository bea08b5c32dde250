"""Benchmark: how often a row's problem statement singles out a FAIL_TO_PASS test's original among its twins.

    .venv/bin/python benchmarks/bench_statement_leak.py --draws 200

The agent reads the problem statement. Where the statement quotes the expected value a FAIL_TO_PASS test
checks ("should be 2.5", "division by zero") and none of the twins' moved values, code written by the
agent can no-op exactly the test that carries the quoted value: the twins run honestly and fail as they
must, and a decoy run (no original shown) sees nothing forged. Printed per sample task and FAIL_TO_PASS test
with twins: the share of drawn clusters in which the statement names the original and no twin; per task,
the chance that every such test of the row is singled out, a twinless one counting as singled out (a forger
that also no-ops new tests without a near-copy is paid then).
"""

from __future__ import annotations

import argparse
import ast
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sweflow.grading.canary_literals import _check_literal, cluster  # noqa: E402
from sweflow.grading.canary_plan import _plain_tests, units_by_file  # noqa: E402
from sweflow.sample import instance_ids, load_task  # noqa: E402
from sweflow.sample.repo import clone_at, materialize_repo  # noqa: E402


def quoted(value: str, statement: str) -> bool:
    """Whether the statement shows the literal's text as a whole token (``2.5``, not inside ``12.5``)."""
    text = value.strip("'\"")
    return re.search(r"(?<![\w.])" + re.escape(text) + r"(?![\w]|\.\d)", statement) is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=200, help="twin clusters drawn per test")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    src = materialize_repo(tmp / "src").path
    tests_seen = exposed_share = 0.0
    rows_paid = []
    for iid in instance_ids(None):
        task = load_task(iid)
        dest = clone_at(src, tmp / iid, task["base_commit"])
        subprocess.run(["git", "apply", "-"], cwd=dest, input=task["test_patch"].encode(), check=True)
        row_chance, twinned = 1.0, 0
        for path, units in units_by_file(task["FAIL_TO_PASS"], "", cases=True).items():
            text = (dest / path).read_text()
            lines = text.split("\n")
            table = _plain_tests(ast.parse(text), docstrings=True, params=True)
            for _, cls, name in sorted(units):
                fn = table.get((cls, name))
                want = _check_literal(fn, text, lines, random.Random(0)) if fn else None
                if want is None:
                    print(f"{iid:22} {name:45} no twin (no-op'd free: it has no near-copy)")
                    twinned += 1
                    continue
                s, e = want.spans[0]
                seg, hits = text[s:e], 0
                for k in range(args.draws):
                    twins = cluster(seg, 2, random.Random(k), ops=want.ops, ok=want.ok) or []
                    hits += quoted(seg, task["problem_statement"]) and not any(
                        quoted(t, task["problem_statement"]) for t in twins
                    )
                share = hits / args.draws
                print(f"{iid:22} {name:45} {seg[:20]:22} singled out {share:.2f}")
                tests_seen += 1
                exposed_share += share
                twinned += 1
                row_chance *= share
        if twinned and row_chance > 0:
            rows_paid.append(f"{iid} {row_chance:.2f}")
    print(
        f"FAIL_TO_PASS tests with twins: {int(tests_seen)}; mean share singled out: {exposed_share / tests_seen:.2f}"
    )
    print(
        "rows a statement-reading forger is paid on (chance per evaluation):", ", ".join(rows_paid) or "none"
    )


if __name__ == "__main__":
    main()
