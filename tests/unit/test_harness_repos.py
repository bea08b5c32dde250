"""Repo names looked up as the harness package does: all eleven SWE-Gym repos through a fork-shaped package."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sweflow.harness import load_harness
from sweflow.harness.grader import HostGrader, host_eval_script
from sweflow.harness.loader import TEST_EXIT_ECHO, repo_key
from sweflow.harness.standalone import WORKDIR, expected_tests, unpack_command
from tests.fixtures.harness_swegym import SWEGYM_REPOS, swegym_rows, write_swegym_harness

PYTHON3 = sys.executable


@pytest.fixture(scope="module", params=[False, True], ids=["mixed-case-parsers", "lower-case-parsers"])
def gym(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("gym")
    name = write_swegym_harness(
        root, "swegym" if not request.param else "swegym_lowerkeys", lower_parsers=request.param
    )
    sys.path.insert(0, str(root))
    try:
        yield load_harness(name)
    finally:
        sys.path.remove(str(root))


def test_fixture_is_shaped_like_the_fork(gym):
    assert "Project-MONAI/MONAI" not in gym.specs_table and "project-monai/monai" in gym.specs_table
    assert len(swegym_rows()) == len(SWEGYM_REPOS) == 11
    assert {r["repo"] for r in swegym_rows()} == set(SWEGYM_REPOS)


def test_repo_key_mirrors_the_package_lookup():
    table = {"getmoto/moto": 1, "project-monai/monai": 2, "Mixed/Case": 3}
    assert repo_key(table, "getmoto/moto") == "getmoto/moto"
    assert repo_key(table, "Project-MONAI/MONAI") == "project-monai/monai"
    assert repo_key(table, "mixed/case") == "Mixed/Case"
    assert repo_key(table, "other/repo") is None
    assert repo_key({"A/b": 1, "a/B": 2}, "a/b") is None, "ambiguous ignoring case: no guess"


@pytest.mark.parametrize("row", swegym_rows(), ids=lambda r: r["repo"])
def test_every_swegym_repo_builds_its_eval_script_and_grades(gym, row, tmp_path):
    script = gym.eval_script(row)
    assert script == gym.make_test_spec(row).eval_script, "the package's own script, byte for byte"
    instrumented = gym.eval_script(row, instrument=True).splitlines()
    end = instrumented.index(": '>>>>> End Test Output'")
    assert instrumented[end - 1] == TEST_EXIT_ECHO
    assert instrumented[end - 2].startswith(SWEGYM_REPOS[row["repo"]][2])
    assert gym.parser_for(row["repo"]) is not None

    files = unpack_command(gym.evaluator_command(row))
    assert host_eval_script(files[f"{WORKDIR}/eval.sh"]).endswith('exit "${sweflow_test_rc:-1}"\n')
    tests = expected_tests(row)
    lines = [f"PASSED {t}" for t in tests["FAIL_TO_PASS"] + tests["PASS_TO_PASS"]]
    if row["repo"] == "pydantic/pydantic":  # its parser also reads the verbose `id STATUS` form
        lines = [f"{t} PASSED" for t in tests["FAIL_TO_PASS"] + tests["PASS_TO_PASS"]]
    log = (
        ">>>>> Start Test Output\n" + "\n".join(lines) + "\n>>>>> End Test Output\nSWEFLOW_TEST_EXIT_CODE=0\n"
    )
    for path, text in files.items():
        (tmp_path / path.rsplit("/", 1)[1]).write_text(text)
    (tmp_path / "eval.log").write_text(log)
    out = subprocess.run(
        [PYTHON3, "-I", str(tmp_path / "parser.py"), "--log", str(tmp_path / "eval.log")]
        + ["--tests", str(tmp_path / "tests.json"), "--eval-returncode", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    payload = json.loads(out.split("=", 1)[1])
    # the parsed test ids keep spaces only where the parser does: pytest -rA splits "[case 1]"
    assert payload["fail_to_pass_success"] == len(tests["FAIL_TO_PASS"]), payload
    spaced = [t for t in tests["PASS_TO_PASS"] if " " in t]
    if row["repo"] == "pydantic/pydantic" or not spaced:
        assert payload["resolved"] is True, payload
    else:  # the -rA parser cuts "[case 1]" at the space: an id with spaces matches exactly only
        assert payload["failure_detail"] == f"pass_to_pass_regression: 1 of 2 ({spaced[0]}=absent)"
    host = HostGrader(gym).grade(log, {**row, "harness": {"package": gym.package}}, 0)
    assert (host.resolved, host.failure_reason) == (payload["resolved"], payload["failure_reason"])


def test_unknown_version_of_a_known_mixed_case_repo_is_one_clear_line(gym):
    row = {**swegym_rows()[9], "version": "0.0"}
    assert row["repo"] == "Project-MONAI/MONAI"
    with pytest.raises(Exception) as err:
        gym.eval_script(row)
    msg = str(err.value)
    assert "version '0.0' of Project-MONAI/MONAI is unknown" in msg and "Project-MONAI__MONAI-5710" in msg
    assert "\n" not in msg


def test_the_package_init_is_not_run(tmp_path):
    """Like the recipe's converter, sweflow imports the fork's harness modules without its top-level
    __init__ (which imports Docker builders and dataset collection): a package whose __init__ cannot run
    still loads, and it builds eval scripts."""
    name = write_swegym_harness(tmp_path, "swegym_heavyinit")
    (tmp_path / name / "__init__.py").write_text("raise ImportError('the heavy top-level import ran')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        harness = load_harness(name)
        assert harness.eval_script(swegym_rows()[0])
    finally:
        sys.path.remove(str(tmp_path))
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]
