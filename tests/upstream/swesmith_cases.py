"""Cases from SWE-smith's own test data (``tests/test_logs`` and ``tests/harness/test_log_parsers.py``).

SWE-smith's PyPI sdist ships no test data, so the cases are kept in the repository: ``VENDORED`` (gzipped
JSON: the upstream logs and reports as they are, the parser-test pairs read from upstream's literals, the
commit they came from). ``load()`` prefers a live checkout when one is there (``$SWEFLOW_UPSTREAM_SWESMITH``,
``../shared/upstream/SWE-smith``, or a bare git mirror at ``$SWEFLOW_UPSTREAM_SWESMITH_GIT``), else the
vendored file. ``python -m tests.upstream.swesmith_cases <checkout-or-git-dir>`` rewrites the vendored file.
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import subprocess
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

GIT_MIRROR = "/work/.mirror/SWE-bench+SWE-smith/repo"
VENDORED = Path(__file__).resolve().parents[1] / "fixtures" / "upstream" / "swesmith-cases.json.gz"
SOURCE = "https://github.com/SWE-bench/SWE-smith (MIT License, Copyright (c) 2024 John Yang)"
# what the cases read (the mirror may lack large files such as the trajectories)
ARCHIVED = (
    "tests/test_logs/run_validation",
    "tests/test_logs/run_evaluation",
    "tests/test_logs/test_output",
    "tests/test_logs/pandas-dev__pandas.95280573.pr_53652.json",
    "tests/harness",
    "tests/conftest.py",
)
# the parser SWE-smith's grading uses for these repos (MAP_REPO_TO_PARSER's default) and its go parser
PYTEST, GOTEST = "parse_log_pytest", "parse_log_gotest"


def root(shared: Path) -> Path | None:
    """A folder holding SWE-smith's ``tests/`` tree, or None."""
    for cand in (os.environ.get("SWEFLOW_UPSTREAM_SWESMITH"), shared / "upstream" / "SWE-smith"):
        if cand and (Path(cand) / "tests" / "test_logs").is_dir():
            return Path(cand)
    return from_git(os.environ.get("SWEFLOW_UPSTREAM_SWESMITH_GIT", GIT_MIRROR))


def from_git(git: str) -> Path | None:
    """SWE-smith's test data at HEAD of a bare git repository, extracted to a temporary folder, or None."""
    if not Path(git).is_dir():
        return None
    out = subprocess.run(
        ["git", "--git-dir", git, "archive", "HEAD", *ARCHIVED],
        capture_output=True,
        timeout=120,
    )
    if out.returncode != 0:
        return None
    dest = Path(tempfile.mkdtemp(prefix="sweflow-swesmith-"))
    with tarfile.open(fileobj=BytesIO(out.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def _as_list(value) -> list[str]:
    return list(ast.literal_eval(value)) if isinstance(value, str) else list(value)


def validation_cases(logs: Path) -> list[dict]:
    """run_validation: the bug-state log, the reference log and the report's F2P/P2P (upstream's arg order)."""
    d = logs / "run_validation"
    report = json.loads((d / "report.json").read_text())
    return [
        {
            "id": "swesmith/run_validation",
            "kind": "smith_validation",
            "parser": PYTEST,
            "bug_log": (d / "test_output.txt").read_text(),
            "reference_log": (d / "test_output_pre_gold.txt").read_text(),
            "expected": {k: sorted(report[k]) for k in ("FAIL_TO_PASS", "PASS_TO_PASS")},
        }
    ]


def evaluation_cases(logs: Path) -> list[dict]:
    """run_evaluation/<id>: one graded prediction each; F2P/P2P are the report's success + failure lists."""
    out = []
    for d in sorted(p for p in (logs / "run_evaluation").iterdir() if p.is_dir()):
        report = json.loads((d / "report.json").read_text())
        st = report["tests_status"]
        f2p = st["FAIL_TO_PASS"]["success"] + st["FAIL_TO_PASS"]["failure"]
        p2p = st["PASS_TO_PASS"]["success"] + st["PASS_TO_PASS"]["failure"]
        out.append(
            {
                "id": f"swesmith/run_evaluation/{d.name}",
                "kind": "smith_evaluation",
                "parser": PYTEST,
                "log": (d / "test_output.txt").read_text(),
                "FAIL_TO_PASS": f2p,
                "PASS_TO_PASS": p2p,
                "expected": {
                    "resolved": bool(report["resolved"]),
                    "FAIL_TO_PASS": sorted(st["FAIL_TO_PASS"]["success"]),
                    "PASS_TO_PASS": sorted(st["PASS_TO_PASS"]["success"]),
                },
            }
        )
    task = logs / "pandas-dev__pandas.95280573.pr_53652.json"
    if task.exists():  # upstream's test_get_eval_tests: the task's own lists against the same log
        inst = json.loads(task.read_text())
        base = next(c for c in out if c["id"].endswith(inst["instance_id"]))
        out.append(
            {
                **base,
                "id": "swesmith/task_instance/" + inst["instance_id"],
                "FAIL_TO_PASS": _as_list(inst["FAIL_TO_PASS"]),
                "PASS_TO_PASS": _as_list(inst["PASS_TO_PASS"]),
            }
        )
    return out


def parser_cases(top: Path) -> list[dict]:
    """The (test id, status) pairs upstream's parser tests assert, read from that file's literals."""
    conftest = (top / "tests" / "conftest.py").read_text()
    tree = ast.parse((top / "tests" / "harness" / "test_log_parsers.py").read_text())
    out = []
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        fixture = fn.args.args[0].arg
        # the fixture returns a path under tests/test_logs/test_output/: find its file name in conftest
        marker = f"def {fixture}():"
        after = conftest.split(marker, 1)[1] if marker in conftest else ""
        names = [s for s in ast.literal_eval("[" + ",".join(_strings(after)) + "]") if s.endswith(".txt")]
        pairs = [
            tuple(ast.literal_eval(elt))
            for node in ast.walk(fn)
            if isinstance(node, ast.List)
            for elt in node.elts
            if isinstance(elt, ast.Tuple)
        ]
        if not names or not pairs:
            continue
        log = (top / "tests" / "test_logs" / "test_output" / Path(names[0]).name).read_text()
        out.append(
            {
                "id": f"swesmith/{fn.name}",
                "kind": "smith_parser",
                "parser": GOTEST if "gotest" in fn.name else PYTEST,
                "log": log,
                "expected": dict(pairs),
            }
        )
    return out


def _strings(text: str) -> list[str]:
    """The string literals of the first statement block in ``text`` (up to the next ``def``)."""
    block = text.split("\ndef ", 1)[0]
    return [
        repr(n.value)
        for n in ast.walk(ast.parse(_dedent_block(block)))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def _dedent_block(block: str) -> str:
    import textwrap

    lines = [ln for ln in block.split("\n") if ln.strip() and not ln.strip().startswith("@")]
    return textwrap.dedent("\n".join(lines))


def cases(top: Path) -> list[dict]:
    logs = top / "tests" / "test_logs"
    return validation_cases(logs) + evaluation_cases(logs) + parser_cases(top)


def load(shared: Path) -> tuple[list[dict], str]:
    """The cases and where they came from: a live checkout when there is one, else the vendored file."""
    top = root(shared)
    if top is not None:
        return cases(top), str(top)
    if not VENDORED.exists():
        return [], "none"
    data = json.loads(gzip.decompress(VENDORED.read_bytes()))
    return data["cases"], f"{VENDORED.name} ({data['source']} at {data['commit'][:12]})"


def vendor(source: str) -> None:
    """Write ``VENDORED`` from a SWE-smith checkout or bare git repository (its HEAD commit recorded)."""
    src = Path(source)
    is_git = (src / "HEAD").is_file() and not (src / "tests").is_dir()
    git = ["git", "--git-dir", str(src)] if is_git else ["git", "-C", str(src)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
    top = from_git(str(src)) if is_git else src
    if top is None:
        raise SystemExit(f"{source}: no SWE-smith test data there")
    data = {"source": SOURCE, "commit": commit.strip(), "cases": cases(top)}
    VENDORED.parent.mkdir(parents=True, exist_ok=True)
    tmp = VENDORED.with_suffix(".tmp")
    tmp.write_bytes(gzip.compress(json.dumps(data, sort_keys=True, indent=0).encode(), mtime=0))
    tmp.replace(VENDORED)
    print(f"{VENDORED}: {len(data['cases'])} cases from {data['commit'][:12]}")


if __name__ == "__main__":
    import sys

    vendor(sys.argv[1])
