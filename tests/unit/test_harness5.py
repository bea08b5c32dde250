"""swebench 5.x as the harness package: eval scripts from rows that carry them, parsers from its tables.

5.x and 4.x share the package name, so 5.x lives in ``.venv/harness5`` (``make setup``) and these tests run
in a subprocess with that folder first on ``sys.path``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS5 = Path(sys.prefix) / "harness5"
pytestmark = pytest.mark.skipif(
    not (HARNESS5 / "swebench" / "harness" / "utils.py").exists(),
    reason=f"swebench 5.x is not installed in {HARNESS5} (run `make setup`)",
)

PROBE = r"""
import json, subprocess, sys, tempfile, pathlib
import swebench
from sweflow.errors import HarnessError
from sweflow.harness import load_harness, unpack_command
from sweflow.harness.grader import HostGrader, host_eval_script
from sweflow.harness.standalone import WORKDIR
from tests.fixtures.harness_swegym import swegym_rows

h = load_harness("swebench")
out = {"version": swebench.__version__, "row_scripts": h.row_scripts}
T = "tests/test_io.py"
script = "\n".join([
    "#!/bin/bash", "set -uxo pipefail", "cd /tmp", "git status",
    ": '>>>>> Start Test Output'", "(exit 3)", ": '>>>>> End Test Output'", "true",
])
row = {
    "instance_id": "astropy__astropy-12907", "repo": "astropy/astropy", "version": "4.3",
    "FAIL_TO_PASS": json.dumps([f"{T}::test_new"]), "PASS_TO_PASS": json.dumps([f"{T}::test_old"]),
    "eval_script": script, "log_parser": "parse_log_pytest", "image": "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest",
    "eval_type": "pass_and_fail", "base_commit": "d16bfe05", "test_patch": "",
}
out["same"] = h.eval_script(row) == h.make_test_spec(row).eval_script
inst = h.eval_script(row, instrument=True)
out["ran"] = subprocess.run(["bash", "-c", inst], capture_output=True, text=True).stdout
host = host_eval_script(inst)
out["host_rc"] = subprocess.run(["bash", "-c", host], capture_output=True, text=True).returncode
out["repo_parser"] = h.parser_for("astropy/astropy").__name__
files = unpack_command(h.evaluator_command(row))
d = pathlib.Path(tempfile.mkdtemp())
for p, text in files.items():
    (d / p.rsplit("/", 1)[1]).write_text(text)
log = (">>>>> Start Test Output\nPASSED %s::test_new\nSKIPPED [1] %s:3: no network\nSKIPPED %s::test_old\n"
       ">>>>> End Test Output\nSWEFLOW_TEST_EXIT_CODE=0\n") % (T, T, T)
(d / "eval.log").write_text(log)
prog = subprocess.run([sys.executable, "-I", str(d / "parser.py"), "--log", str(d / "eval.log"), "--tests",
                       str(d / "tests.json"), "--dump-statuses", str(d / "s.json")], capture_output=True, text=True)
out["program"] = json.loads(prog.stdout.split("=", 1)[1]) if prog.stdout else prog.stderr
out["statuses"] = json.loads((d / "s.json").read_text())
meta = {**row, "FAIL_TO_PASS": [f"{T}::test_new"], "PASS_TO_PASS": [f"{T}::test_old"]}  # lists, as metadata has
out["host_resolved"] = HostGrader(h).grade(log, meta, 0).resolved
from sweflow.dataset.convert import ConvertOptions, convert_split
from sweflow.dataset.splits import check_instance
parquet_row = {**row, "patch": "", "problem_statement": "Fix it.", "hints_text": None}
inst, problems = check_instance(parquet_row, index=0)
opts = ConvertOptions(dataset="d", split="test", provider="docker")
image = opts.naming.image_for(inst["instance_id"], inst["repo"])
res = convert_split([inst], template_map={image: "tpl"}, failed_images={}, harness=h, opts=opts, source_file="f")
out["convert"] = {"problems": [str(p) for p in problems], "skipped": res.skipped,
                  "parser": res.rows[0]["metadata"]["harness"]["parser"] if res.rows else None}
try:
    h.eval_script(swegym_rows()[9])
except HarnessError as exc:
    out["gym_error"] = str(exc)
print("RESULT=" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HARNESS5), str(Path.cwd())])}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env, cwd=Path.cwd()
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.rsplit("RESULT=", 1)[1])


def test_5x_layout_is_detected_and_builds_the_rows_own_script(probe):
    assert probe["version"].startswith("5.") and probe["row_scripts"] is True
    assert probe["same"], "the package's make_test_spec(row).eval_script, byte for byte"


def test_5x_instrumentation_keeps_both_exit_code_records(probe):
    assert "SWEFLOW_TEST_EXIT_CODE=3" in probe["ran"] and ">>>>> Test Exit Code: 3" in probe["ran"]
    assert probe["host_rc"] == 3, "the host script exits with the test command's own status"


def test_5x_parsers_by_name_and_by_repo_run_in_the_sandbox_program(probe):
    assert probe["repo_parser"] == "parse_log_pytest_v2"  # astropy, from MAP_REPO_TO_PARSER_PY
    # 5.x's parser drops pytest's "SKIPPED [1] path:line" summary; a skipped P2P test is not a regression
    assert probe["statuses"] == {
        "tests/test_io.py::test_new": "PASSED",
        "tests/test_io.py::test_old": "SKIPPED",
    }
    assert probe["program"]["resolved"] is True and probe["host_resolved"] is True


def test_a_swegym_row_without_eval_script_is_one_clear_line(probe):
    msg = probe["gym_error"]
    assert "Project-MONAI__MONAI-5710" in msg and "eval_script" in msg and "\n" not in msg
    assert "builds eval scripts only from rows that carry eval_script and log_parser" in msg


def test_a_5x_row_converts_and_keeps_its_own_parser(probe):
    # the row names parse_log_pytest; the repo table would say parse_log_pytest_v2
    assert probe["convert"] == {"problems": [], "skipped": [], "parser": "parse_log_pytest"}


FAIL_ONLY = r"""
import json, pathlib, subprocess, sys, tempfile
from sweflow.harness import load_harness, unpack_command
from sweflow.harness.grader import HostGrader

h = load_harness("swebench")
g = HostGrader(h)
S, E = h.start_marker, h.end_marker
f2p, p2p = ["renders the heading"], ["keeps links"]
row = {"instance_id": "markedjs__marked-1", "repo": "markedjs/marked", "version": "1.0", "base_commit": "abc",
       "test_patch": "", "FAIL_TO_PASS": json.dumps(f2p), "PASS_TO_PASS": json.dumps(p2p),
       "eval_script": "#!/bin/bash\n: '%s'\nnpm test\n: '%s'\n" % (S, E), "log_parser": "parse_log_marked",
       "image": "x:latest", "eval_type": "fail_only"}
meta = {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "repo": row["repo"], "instance_id": row["instance_id"],
        "harness": {"package": "swebench", "parser": "parse_log_marked", "eval_type": "fail_only"}}
logs = {
    "clean": "%s\nStarted\n.....\n\n658 specs, 0 failures\n%s\n" % (S, E),
    "never_ran": "%s\nbrowser failed to launch\n%s\n" % (S, E),
    "f2p_failed": "%s\nStarted\n..F\nFailures:\n1) renders the heading\n  Message:\n    x\n\n658 specs, 1 failure\n%s\n" % (S, E),
}
out = {k: [g.grade(v, meta, 0).resolved, g.grade(v, meta, 0).failure_reason] for k, v in logs.items()}
# the sandbox program reads the same mode from its tests file
files = unpack_command(h.evaluator_command(row))
d = pathlib.Path(tempfile.mkdtemp())
for p, text in files.items():
    (d / p.rsplit("/", 1)[1]).write_text(text)
(d / "eval.log").write_text(logs["clean"])
prog = subprocess.run([sys.executable, "-I", str(d / "parser.py"), "--log", str(d / "eval.log"), "--tests",
                       str(d / "tests.json")], capture_output=True, text=True)
out["program_clean"] = json.loads(prog.stdout.split("=", 1)[1])["resolved"]
out["tests_json"] = json.loads((d / "tests.json").read_text())
print("RESULT=" + json.dumps(out))
"""


def test_a_fail_only_row_resolves_on_a_clean_run_with_evidence_and_only_then():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HARNESS5), str(Path.cwd())])}
    proc = subprocess.run(
        [sys.executable, "-c", FAIL_ONLY],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=Path.cwd(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.rsplit("RESULT=", 1)[1])
    assert out["clean"] == [True, None]  # swebench 5.x's marked parser records failures only
    assert out["never_ran"] == [False, "no_tests_parsed"]  # no SUITE_RAN evidence
    assert out["f2p_failed"][0] is False
    assert out["program_clean"] is True and out["tests_json"]["eval_type"] == "fail_only"
