"""Patch integrity: tests, test infrastructure, files the eval script relies on, code reaching for the run."""

from __future__ import annotations

import pytest

from sweflow.grading.integrity import IntegrityRules
from sweflow.grading.patch_integrity import (
    changed_lines,
    check_patch_integrity,
    eval_script_facts,
    patch_paths,
)
from sweflow.sample import sample_rows
from sweflow.stages.data import harness_from_config


def diff(path: str, old: str, new: str) -> str:
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-{old}\n+{new}\n"


def new_file(path: str, *lines: str) -> str:
    body = "".join(f"+{ln}\n" for ln in lines)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n{body}"
    )


SRC = diff("calclib/tokenizer.py", "x = 1", "x = 2")
META = {"FAIL_TO_PASS": ["pkg/test_units.py::test_a"], "PASS_TO_PASS": ["tests/test_b.py::test_b"]}
SCRIPT = """#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
source /testbed/ci/env.sh
cd /testbed
python -m pip install -e .[test]
git apply -v - <<'EOF_1'
diff --git a/tests/fixtures/data.json b/tests/fixtures/data.json
--- a/tests/fixtures/data.json
+++ b/tests/fixtures/data.json
diff --git a/pkg/expected.txt b/pkg/expected.txt
--- a/pkg/expected.txt
+++ b/pkg/expected.txt
EOF_1
pytest -rA pkg/test_units.py
"""


def rules_of(patch: str, **kw) -> list[str]:
    return [v.rule for v in check_patch_integrity(patch, **kw)]


def test_a_plain_source_fix_passes():
    assert check_patch_integrity(SRC, metadata=META, eval_script=SCRIPT) == []


@pytest.mark.parametrize(
    ("patch", "rule"),
    [
        (diff("tests/test_b.py", "a", "b"), "test_file"),
        (new_file("calclib/conftest.py", "import pytest"), "test_file"),
        (new_file("sitecustomize.py", "import builtins"), "test_infrastructure"),
        (new_file("src/usercustomize.py", "pass"), "test_infrastructure"),
        (new_file("calclib/zz_hook.pth", "import calclib.hook"), "test_infrastructure"),
        (new_file("pytest.ini", "[pytest]"), "test_file"),
        (diff("setup.cfg", "[metadata]", "[tool:pytest]"), "test_config"),
        (
            diff("pyproject.toml", 'testpaths = ["tests"]', 'addopts = "--deselect tests/test_b.py"'),
            "test_config",
        ),
        (diff("pyproject.toml", "x = 1", '"pytest11" = {force = "calclib.force"}'), "test_config"),
        (new_file("calclib/__pycache__/tokenizer.cpython-311.pyc", "binary"), "compiled_code"),
        (new_file("calclib/__pycache__/notes.txt", "x"), "compiled_code"),
        (new_file("calclib/_speedups.cpython-311-x86_64-linux-gnu.so", "elf"), "compiled_code"),
        (new_file("calclib/tokenizer.pyc", "binary"), "compiled_code"),
    ],
)
def test_test_infrastructure_is_refused_without_the_eval_script(patch, rule):
    assert rules_of(patch) == [rule]


def test_config_files_may_change_outside_test_settings():
    assert rules_of(diff("pyproject.toml", 'version = "0.1.0"', 'version = "0.1.1"')) == []


def test_eval_script_facts():
    facts = eval_script_facts(SCRIPT)
    assert facts.installs_repo and facts.sourced == {"ci/env.sh"}
    assert facts.test_patch_files == {"tests/fixtures/data.json", "pkg/expected.txt"}
    assert not eval_script_facts("pip install pytest==7.4\npytest -rA\n").installs_repo
    for install in ("pip install -e .", "python setup.py develop", "pip install .[dev]", "pip3 install ./"):
        assert eval_script_facts(install + "\n").installs_repo, install


@pytest.mark.parametrize(
    ("patch", "rule"),
    [
        (diff("ci/env.sh", "A=1", "export PYTEST_ADDOPTS=-p no:x"), "eval_sourced_file"),
        (diff("setup.py", "version='1'", "version='2'"), "install_file"),
        (diff("requirements-test.txt", "a", "b"), "install_file"),
        (diff("pkg/expected.txt", "1", "2"), "test_patch_file"),
        (diff("pkg/snapshots/out.json", "1", "2"), "test_data"),
    ],
)
def test_files_the_eval_script_relies_on_are_refused(patch, rule):
    assert rules_of(patch, metadata=META, eval_script=SCRIPT) == [rule]
    if rule in ("install_file", "eval_sourced_file"):
        assert rules_of(patch, metadata=META) == [], "only with the eval script"


@pytest.mark.parametrize(
    "line",
    [
        "import _pytest.runner",
        "def pytest_runtest_makereport(item, call):",
        "os.kill(os.getppid(), 9)",
        "pid = os.fork()",
        "open('/proc/%d/fd/1' % ppid, 'w')",
        "os._exit(0)",
        "sys.stdout = Filter(sys.stdout)",
        "import ctypes",
        "atexit.register(rewrite)",
        "os.ftruncate(1, 0)",
        "sys.modules['pytest'].main = fake",
        "_os.kill(-1, _signal.SIGKILL)",
        "from os import fork as f",
        "_o.dup2(w, 1)",
        "os.execv('/bin/true', ['true'])",
        "os.write(fd, forged)",
        "__import__('o' + 's')",
        "getattr(os, name)(1)",
        "pytest.Function.runtest = lambda self: None",
        "_p.Item.runtest = _noop",
        "import pluggy",
        "unittest.case.TestCase.run = _run",
        "TestResult.addFailure = TestResult.addSuccess",
        "setattr(unittest.TestCase, 'run', _run)",
        "for o in gc.get_objects():",
        "f.__code__ = g.__code__",
        "sys.addaudithook(hook)",
    ],
)
def test_code_that_reaches_for_the_test_run_is_refused(line):
    assert rules_of(diff("calclib/__init__.py", "x = 1", line)) == ["tamper_code"]


def test_ordinary_code_is_not_tamper_code():
    for line in (
        "sys.stdout.write(text)",
        "if sys.stdout == other:",
        "import pytest_cov_like_name_in_doc",
        "if result.code == expected.code:",
        "self.runtests = []",
        "class Case(TestCaseBase):",
    ):
        assert rules_of(diff("calclib/__init__.py", "x = 1", line)) == [], line


def test_tamper_patterns_are_configurable():
    rules = IntegrityRules(tamper_patterns=())
    assert check_patch_integrity(diff("calclib/a.py", "x", "import ctypes"), rules=rules) == []
    rules = IntegrityRules.from_config({"tamper_patterns": [r"\bsubprocess\b"]})
    assert [v.rule for v in check_patch_integrity(diff("a.py", "x", "import subprocess"), rules=rules)] == [
        "tamper_code"
    ]


def test_test_file_violations_come_first_and_name_their_reason():
    found = check_patch_integrity(new_file("sitecustomize.py", "x") + diff("tests/test_b.py", "a", "b"))
    assert [(v.rule, v.reason) for v in found] == [
        ("test_file", "prohibited_test_modification"),
        ("test_infrastructure", "prohibited_test_infrastructure"),
    ]


def test_diffs_the_checks_cannot_read_are_refused():
    """Agent-controlled git config (mnemonic prefixes) plus a binary attribute: no a/ b/ and no ---/+++."""
    blind = (
        "diff --git c/conftest.py i/conftest.py\nnew file mode 100644\nGIT binary patch\nliteral 5\nzcmV\n\n"
    )
    assert rules_of(blind) == ["unreadable_diff"]
    quoted_binary = 'diff --git "a/tests/d\\303\\251j\\303\\240.py" "b/tests/d\\303\\251j\\303\\240.py"\nGIT binary patch\n'
    assert patch_paths(quoted_binary) == ["tests/déjà.py"] and rules_of(quoted_binary) == ["test_file"]
    mode_only = "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n"
    assert patch_paths(mode_only) == ["run.sh"] and rules_of(mode_only) == []


def test_hunk_lines_are_never_read_as_headers():
    patch = "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1,2 +1,1 @@\n--- b/tests/test_x.py\n x\n"
    assert patch_paths(patch) == ["a.py"]


@pytest.mark.parametrize(
    "path",
    [".gitattributes", "sub/.gitignore", "sympy/utilities/runtests.py", "pandas/_testing/asserters.py"],
)
def test_files_that_decide_what_a_diff_or_a_test_run_shows(path):
    assert rules_of(diff(path, "a", "b")) in (["test_infrastructure"], ["test_file"])


def test_changed_lines_and_paths():
    patch = SRC + new_file("new dir/x.cfg", "a", "b")
    assert changed_lines(patch) == {"calclib/tokenizer.py": ["x = 1", "x = 2"], "new dir/x.cfg": ["a", "b"]}
    assert patch_paths(patch) == ["calclib/tokenizer.py", "new dir/x.cfg"]


def test_every_sample_gold_patch_is_clean():
    harness = harness_from_config("swebench", "sample")
    rows = sample_rows("train") + sample_rows("validation")
    for row in rows:
        script = harness.eval_script(row, instrument=True)
        assert check_patch_integrity(row["patch"], metadata=row, eval_script=script) == [], row["instance_id"]


def test_patches_over_the_size_caps_are_refused_unread():
    rules = IntegrityRules(max_patch_bytes=400, max_applied_bytes=1000)
    big = new_file("calclib/big.py", *(f"x{i} = {i}" for i in range(100)))
    assert [(v.rule, v.reason) for v in check_patch_integrity(big, rules=rules)] == [
        ("patch_too_large", "patch_too_large")
    ]
    # a small binary patch that declares a large inflated size
    binary = (
        "diff --git a/calclib/blob.bin b/calclib/blob.bin\nnew file mode 100644\n"
        "GIT binary patch\nliteral 5000\nzcmeIu0Sy2E0K%a6Pi+hKh(KY$fB^#r3>YwAz<>b*1`HT5V8DO@0|pEjFkrxd\n\n"
        "literal 0\nHcmV?d00001\n\n"
    )
    assert rules_of(binary, rules=rules) == ["patch_too_large"]
    assert rules_of(binary) == []  # within the default caps
    assert rules_of(SRC, rules=rules) == []
