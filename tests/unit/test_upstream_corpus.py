"""sweflow's grading against upstream's own test data: SWE-bench's parser and grading tests (swebench 5.0.2's
sdist, ``make setup``), SWE-smith's test logs with their reports, and the SWE-Gym fork where present.

Every case is answered by sweflow for each harness version; a disagreement fails unless the harness's own
function gives the same answer or ``tests/upstream/known.py`` lists it with its reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

import pytest

from tests.upstream import compare, known, swesmith_cases

UPSTREAM = Path(sys.prefix) / "upstream"
SWEBENCH_TESTS = UPSTREAM / "swebench-5.0.2" / "tests"
HARNESS5 = Path(sys.prefix) / "harness5"
SHARED = Path(__file__).resolve().parents[3] / "shared"
SWEGYM_GIT = os.environ.get("SWEFLOW_UPSTREAM_SWEGYM_GIT", "/work/.mirror/SWE-Gym+SWE-Bench-Fork/repo")

pytestmark = pytest.mark.skipif(
    not (SWEBENCH_TESTS.is_dir() and (HARNESS5 / "swebench").is_dir()),
    reason=f"swebench 5.0.2's tests or package missing under {sys.prefix} (run `make setup`)",
)


def _swegym_fork() -> Path | None:
    """A folder holding the SWE-Gym fork's ``swebench`` package: $SWEFLOW_UPSTREAM_SWEGYM or a git mirror."""
    folder = os.environ.get("SWEFLOW_UPSTREAM_SWEGYM")
    if folder and (Path(folder) / "swebench").is_dir():
        return Path(folder)
    if not Path(SWEGYM_GIT).is_dir():
        return None
    out = subprocess.run(["git", "--git-dir", SWEGYM_GIT, "archive", "HEAD", "swebench"], capture_output=True)
    if out.returncode != 0:
        return None
    dest = Path(tempfile.mkdtemp(prefix="sweflow-swegym-"))
    with tarfile.open(fileobj=BytesIO(out.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


@pytest.fixture(scope="module")
def corpus():
    cases = compare.record_swebench(SWEBENCH_TESTS, HARNESS5)
    smith, source = swesmith_cases.load(SHARED)
    print(f"\nSWE-smith cases: {len(smith)} from {source}")
    return cases, smith


@pytest.fixture(scope="module")
def results(corpus):
    swebench, smith = corpus
    cases = swebench + smith
    harnesses = [("swebench", []), ("swebench", [HARNESS5])]
    fork = _swegym_fork()
    if fork is not None:
        harnesses.append(("swebench", [fork]))
    out = []
    for package, path in harnesses:
        got = compare.answers(package, cases, path)
        out.append((got["version"], cases, got["answers"]))
    return out


def _harness_own(case: dict, answer: dict) -> bool:
    """The harness package's own function is wrong here and sweflow changed nothing it said (sweflow may
    only have added ids from pytest's verbose lines): a harness-version difference, not sweflow's."""
    raw, ours = answer.get("harness"), answer["sweflow"]
    if raw is None or raw == case["expected"]:
        return False
    if isinstance(raw, str) or isinstance(ours, str):
        return raw == ours
    return all(ours.get(k) == v for k, v in raw.items())


def test_upstream_recording_found_the_cases(corpus):
    swebench, smith = corpus
    kinds = {c["kind"] for c in swebench}
    assert len(swebench) >= 60 and kinds >= {
        "parser",
        "logs_eval",
        "test_passed",
        "test_failed",
        "eval_report",
    }
    # SWE-smith's cases are kept in the repository, so they are always there
    assert {c["kind"] for c in smith} == {"smith_validation", "smith_evaluation", "smith_parser"}
    assert len(smith) >= 8


def test_sweflow_agrees_with_upstream_on_every_case_not_listed(results, capsys):
    failures, lines, deliberate_seen = [], [], set()
    for version, cases, answers in results:
        listed = {**known.DELIBERATE, **known.HARNESS.get(version, {})}
        counts = {"agree": 0, "harness": 0, "listed": 0, "smith_agree": 0, "smith": 0}
        for case in cases:
            ans = answers[case["id"]]
            smith = case["kind"].startswith("smith_")
            counts["smith"] += smith
            if compare.agrees(case, ans):
                counts["agree"] += 1
                counts["smith_agree"] += smith
                if case["id"] in known.HARNESS.get(version, {}):
                    failures.append(f"{version}: {case['id']} is listed as a disagreement but now agrees")
            elif case["id"] in listed:
                counts["listed"] += 1
                deliberate_seen.add(case["id"])
            elif _harness_own(case, ans):
                counts["harness"] += 1
            else:
                failures.append(
                    f"{version}: {case['id']}: expected {case['expected']!r}, sweflow {ans!r}"[:600]
                )
        lines.append(
            f"upstream corpus, harness swebench {version}: agree {counts['agree']} of {len(cases)} "
            f"(SWE-smith {counts['smith_agree']} of {counts['smith']}); disagree: "
            f"{counts['harness']} the harness's own answer, {counts['listed']} listed in tests/upstream/known.py"
        )
    # a deliberate disagreement may agree on a harness without test-output markers, never on all
    failures += [
        f"{c} is listed as deliberate but agrees everywhere" for c in set(known.DELIBERATE) - deliberate_seen
    ]
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert not failures, "\n".join(failures)
