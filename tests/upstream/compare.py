"""Compare sweflow's answers with upstream's expected ones, per harness package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

FULL = "RESOLVED_FULL"


def agrees(case: dict, answer: dict) -> bool:
    """True when sweflow's answer is upstream's expected one (the comparison each kind calls for)."""
    exp, ours = case["expected"], answer.get("sweflow")
    kind = case["kind"]
    if isinstance(ours, str):  # missing parser, exception
        return False
    if kind == "logs_eval":
        return ours["found"] == exp["found"] and (not exp["found"] or ours["statuses"] == exp["statuses"])
    if kind == "eval_report":
        lists = all(ours[k] == exp[k] for k in ("FAIL_TO_PASS", "PASS_TO_PASS"))
        return lists and ("resolution" not in exp or (exp["resolution"] == FULL) == ours["resolved"])
    if kind == "smith_evaluation":
        return ours["resolved"] == exp["resolved"] and all(
            ours[k] == exp[k] for k in ("FAIL_TO_PASS", "PASS_TO_PASS")
        )
    return ours == exp


def answers(package: str, cases: list[dict], path_first: list[str] = ()) -> dict:
    """Run ``tests.upstream.answers`` for ``package`` in a subprocess (harness versions share a name)."""
    repo = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*(str(Path(p).resolve()) for p in path_first), str(repo)]),
    }
    with tempfile.TemporaryDirectory() as tmp:
        cases_file, out = Path(tmp, "cases.json"), Path(tmp, "answers.json")
        cases_file.write_text(json.dumps(cases))
        proc = subprocess.run(
            [sys.executable, "-m", "tests.upstream.answers", package, str(cases_file), str(out)],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=repo,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"answers for {package} failed:\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


def record_swebench(tests_dir: Path, harness5: Path) -> list[dict]:
    """Run SWE-bench's own tests under the recorder (swebench 5.x first on the path); unique cases."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(harness5).resolve()), str(repo)])}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "cases.json")
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.upstream.record_swebench",
                str(Path(tests_dir).resolve()),
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=tmp,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"recording SWE-bench's tests failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
            )
        data = json.loads(out.read_text())
    seen, unique = set(), []
    for case in data["cases"]:
        key = json.dumps({k: v for k, v in case.items() if k != "id"}, sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(case)
    return unique
