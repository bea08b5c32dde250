"""Harness loading, repo registration, eval scripts (against swebench's own make_test_spec) and the command."""

from __future__ import annotations

import ast
import json

import pytest

from sweflow.errors import HarnessError
from sweflow.harness import expected_tests, instrument_exit_code, load_harness, unpack_command
from sweflow.harness.loader import TEST_EXIT_ECHO

swebench = pytest.importorskip("swebench", reason="swebench 4.x is the harness the tests run against")
from swebench.harness.test_spec.test_spec import make_test_spec  # noqa: E402

CALCLIB = "sweflow/calclib"
CALCLIB_SPECS = {CALCLIB: {"0.1": {"python": "3.11", "test_cmd": "pytest -rA"}}}
CALCLIB_PARSERS = {CALCLIB: "parse_log_pytest"}

TEST_PATCH = """diff --git a/{path} b/{path}
--- a/{path}
+++ b/{path}
@@ -1,2 +1,5 @@
 import calclib
 def test_add(): assert calclib.add(1, 2) == 3
+
+def test_sub():
+    assert calclib.sub(3, 1) == 2
"""


def calclib_instance(n: int = 1) -> dict:
    return {
        "instance_id": f"sweflow__calclib-{n}",
        "repo": CALCLIB,
        "version": "0.1",
        "base_commit": "0123456789abcdef0123456789abcdef01234567",
        "patch": "",
        "test_patch": TEST_PATCH.format(path="tests/test_ops.py"),
        "problem_statement": "sub is missing",
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "FAIL_TO_PASS": json.dumps(["tests/test_ops.py::test_sub"]),
        "PASS_TO_PASS": json.dumps(["tests/test_ops.py::test_add"]),
    }


def astropy_instance() -> dict:
    # Shape of a real SWE-bench row (astropy__astropy-12907); JSON-string test lists as SWE-bench stores them.
    path = "astropy/modeling/tests/test_separable.py"
    return {
        "instance_id": "astropy__astropy-12907",
        "repo": "astropy/astropy",
        "version": "4.3",
        "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
        "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
        "patch": "",
        "test_patch": TEST_PATCH.format(path=path),
        "problem_statement": "separability_matrix does not compute separability correctly for nested CompoundModels",
        "hints_text": "",
        "created_at": "2022-03-03T15:14:54Z",
        "FAIL_TO_PASS": json.dumps([f"{path}::test_separable[compound_model6-result6]"]),
        "PASS_TO_PASS": json.dumps([f"{path}::test_coord_matrix"]),
    }


@pytest.fixture(scope="module")
def harness():
    h = load_harness("swebench")
    h.register_repos(CALCLIB_SPECS, CALCLIB_PARSERS)
    return h


def test_load_harness_missing_package_is_a_clear_error():
    with pytest.raises(HarnessError, match="not installed"):
        load_harness("no_such_harness_pkg_xyz")


def test_load_harness_unsupported_layout(tmp_path, monkeypatch):
    # A package that imports but lacks harness.test_spec.make_test_spec (like swebench 5.x's moved modules).
    pkg = tmp_path / "fakeharness" / "harness"
    pkg.mkdir(parents=True)
    (tmp_path / "fakeharness" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "constants.py").write_text("MAP_REPO_VERSION_TO_SPECS = {}\n")
    (pkg / "log_parsers.py").write_text("MAP_REPO_TO_PARSER = {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(HarnessError, match="unsupported layout"):
        load_harness("fakeharness")


def test_eval_script_equals_official_make_test_spec_for_real_instance(harness):
    inst = astropy_instance()
    ours = harness.eval_script(inst)
    assert ours == make_test_spec(inst).eval_script
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    test_cmd = MAP_REPO_VERSION_TO_SPECS["astropy/astropy"]["4.3"]["test_cmd"]
    assert f"\n{test_cmd} astropy/modeling/tests/test_separable.py\n" in ours


def test_instrumented_script_is_official_plus_one_line(harness):
    inst = astropy_instance()
    official = make_test_spec(inst).eval_script.split("\n")
    ours = harness.eval_script(inst, instrument=True).split("\n")
    assert len(ours) == len(official) + 1
    i = ours.index(TEST_EXIT_ECHO)
    assert ours[:i] + ours[i + 1 :] == official
    assert ours[i - 1].startswith("pytest -rA")
    assert ours[i + 1] == ": '>>>>> End Test Output'"


def test_registered_sample_repo_builds_with_official_builder(harness):
    inst = calclib_instance()
    script = harness.eval_script(inst)
    assert script == make_test_spec(inst).eval_script
    assert "\npytest -rA tests/test_ops.py\n" in script
    assert "git checkout 0123456789abcdef0123456789abcdef01234567 tests/test_ops.py" in script


def test_register_repos_is_idempotent_and_fills_every_table(harness):
    from swebench.harness.constants import MAP_REPO_TO_EXT, MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.grading import MAP_REPO_TO_PARSER as grading_parsers
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    from swebench.harness.log_parsers.python import parse_log_pytest

    before = harness.eval_script(calclib_instance())
    harness.register_repos(CALCLIB_SPECS, CALCLIB_PARSERS)
    assert harness.eval_script(calclib_instance()) == before
    assert MAP_REPO_VERSION_TO_SPECS[CALCLIB]["0.1"]["test_cmd"] == "pytest -rA"
    assert MAP_REPO_TO_EXT[CALCLIB] == "py"
    assert MAP_REPO_TO_PARSER[CALCLIB] is parse_log_pytest is grading_parsers[CALCLIB]


def test_register_mixed_case_repo_also_lower_cased(harness):
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    harness.register_repos(
        {"SweFlow/MixedCase": {"1.0": {"test_cmd": "pytest -rA"}}}, {"SweFlow/MixedCase": "parse_log_pytest"}
    )
    assert (
        "sweflow/mixedcase" in MAP_REPO_VERSION_TO_SPECS and "SweFlow/MixedCase" in MAP_REPO_VERSION_TO_SPECS
    )
    assert harness.parser_for("SweFlow/MixedCase") is not None


def test_register_rejects_spec_without_test_cmd_and_unknown_parser(harness):
    with pytest.raises(HarnessError, match="test_cmd"):
        harness.register_repos({"x/y": {"1": {"python": "3.11"}}}, {})
    with pytest.raises(HarnessError, match="no log parser named"):
        harness.register_repos({}, {"x/y": "parse_log_nonexistent"})


def test_unknown_repo_and_version_name_instance_and_field(harness):
    with pytest.raises(HarnessError) as e:
        harness.eval_script(dict(calclib_instance(), repo="nobody/nothing"))
    assert "sweflow__calclib-1" in str(e.value) and "'repo'" in str(e.value)
    with pytest.raises(HarnessError) as e:
        harness.eval_script(dict(calclib_instance(3), version="9.9"))
    assert "sweflow__calclib-3" in str(e.value) and "'version'" in str(e.value)
    with pytest.raises(HarnessError, match="'test_patch'"):
        inst = calclib_instance()
        del inst["test_patch"]
        harness.eval_script(inst)


def test_instrumentation_without_markers_falls_back_to_test_cmd():
    cmds = ["cd /testbed", "pytest -rA tests/a.py", "git checkout x tests/a.py"]
    assert instrument_exit_code(cmds, None, None, "pytest -rA") == [cmds[0], cmds[1], TEST_EXIT_ECHO, cmds[2]]
    with pytest.raises(HarnessError, match="cannot find the test command"):
        instrument_exit_code(cmds, None, None, "tox -e py")


def test_standalone_parser_source_is_stdlib_only_and_uses_package_source(harness):
    import inspect

    from swebench.harness.log_parsers.python import parse_log_pytest_v2

    src = harness.standalone_parser_source("astropy/astropy")
    assert inspect.getsource(parse_log_pytest_v2) in src
    assert "class TestStatus(Enum):" in src
    tree = ast.parse(src, feature_version=(3, 7))  # sandbox interpreters can be old
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= {"__future__", "json", "re", "sys", "dataclasses", "enum"}, imported


def test_every_package_parser_inlines_and_compiles(harness):
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

    for repo in list(MAP_REPO_TO_PARSER):
        compile(harness.standalone_parser_source(repo), repo, "exec")


def test_evaluator_command_is_deterministic_and_embeds_the_parts(harness):
    inst = calclib_instance()
    cmd = harness.evaluator_command(inst, timeout_sec=77)
    assert cmd == harness.evaluator_command(inst, timeout_sec=77)
    files = unpack_command(cmd)
    assert files["/tmp/sweflow_eval/eval.sh"] == harness.eval_script(inst, instrument=True)
    assert files["/tmp/sweflow_eval/parser.py"] == harness.standalone_parser_source(CALCLIB)
    assert json.loads(files["/tmp/sweflow_eval/tests.json"]) == expected_tests(inst)
    assert expected_tests(inst)["FAIL_TO_PASS"] == ["tests/test_ops.py::test_sub"]
    assert "timeout -k 30 77 bash /tmp/sweflow_eval/eval.sh" in cmd
    assert "--marker SWEFLOW_REWARD_JSON=" in cmd
    with pytest.raises(HarnessError, match="timeout_sec"):
        harness.evaluator_command(inst, timeout_sec=0)


FAKE_SWEGYM = {
    "__init__.py": "",
    "harness/__init__.py": "",
    "harness/constants.py": (
        "from enum import Enum\n"
        "class TestStatus(Enum):\n    PASSED = 'PASSED'\n    FAILED = 'FAILED'\n"
        "MAP_REPO_VERSION_TO_SPECS = {'getmoto/moto': {'4.1': {'test_cmd': 'pytest -n0 -rA'}}}\n"
    ),
    "harness/test_spec.py": (
        "from dataclasses import dataclass\n"
        "from fakegym.harness.constants import MAP_REPO_VERSION_TO_SPECS\n"
        "@dataclass\nclass TestSpec:\n    eval_script_list: list\n"
        "    @property\n    def eval_script(self):\n"
        "        return '\\n'.join(['#!/bin/bash', 'set -uxo pipefail'] + self.eval_script_list) + '\\n'\n"
        "def make_eval_script_list(instance, specs, env_name, repo_directory, base_commit, test_patch):\n"
        "    return [f'cd {repo_directory}', specs['test_cmd'] + ' tests/t.py', f'git checkout {base_commit}']\n"
        "def make_test_spec(instance):\n"
        "    specs = MAP_REPO_VERSION_TO_SPECS[instance['repo']][instance['version']]\n"
        "    return TestSpec(make_eval_script_list(instance, specs, 'testbed', '/testbed', instance['base_commit'], ''))\n"
    ),
    "harness/log_parsers.py": (
        "from fakegym.harness.constants import TestStatus\n"
        "def parse_log_pytest(log):\n"
        "    return {l.split()[1]: l.split()[0] for l in log.split('\\n')\n"
        "            if any(l.startswith(s.value) for s in TestStatus) and len(l.split()) > 1}\n"
        "MAP_REPO_TO_PARSER = {'getmoto/moto': parse_log_pytest}\n"
    ),
}


def test_swegym_style_layout_without_markers(tmp_path, monkeypatch):
    import subprocess
    import sys

    for rel, text in FAKE_SWEGYM.items():
        (tmp_path / "fakegym" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fakegym" / rel).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    h = load_harness("fakegym")
    inst = {
        "instance_id": "getmoto__moto-1",
        "repo": "getmoto/moto",
        "version": "4.1",
        "base_commit": "b",
        "test_patch": "",
    }
    assert h.eval_script(inst) == h.make_test_spec(inst).eval_script
    lines = h.eval_script(inst, instrument=True).splitlines()
    assert lines[lines.index("pytest -n0 -rA tests/t.py") + 1] == TEST_EXIT_ECHO
    h.register_repos(
        {"SWEflow/CalcLib": {"0.1": {"test_cmd": "pytest -rA"}}}, {"SWEflow/CalcLib": "parse_log_pytest"}
    )
    assert h.parser_table["sweflow/calclib"] is h.parser_table["getmoto/moto"]
    prog = tmp_path / "p.py"
    prog.write_text(h.standalone_parser_source("getmoto/moto"))
    (tmp_path / "log").write_text("PASSED tests/t.py::a\nSWEFLOW_TEST_EXIT_CODE=0\n")
    (tmp_path / "t.json").write_text(json.dumps({"FAIL_TO_PASS": ["tests/t.py::a"], "PASS_TO_PASS": []}))
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            str(prog),
            "--log",
            str(tmp_path / "log"),
            "--tests",
            str(tmp_path / "t.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    payload = json.loads(out.split("=", 1)[1])
    assert (payload["resolved"], payload["test_exit_code"], payload["eval_returncode"]) == (True, 0, None)
