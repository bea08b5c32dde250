"""Canaries in test classes and for the Django and sympy runner families (sweflow.grading.canary): planned,
placed and run by real pytest, real unittest (the runner Django's is made of) and a runner in sympy's
bin/test output shape, then read by the harness's own parsers."""

from __future__ import annotations

import ast
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sweflow.grading import canary, canary_place, canary_plan
from sweflow.harness import driver

RUNNERS = Path(__file__).resolve().parents[1] / "fixtures" / "runners"

CLASS_FILE = """\\
import unittest


def double(x):
    return 2 * x


class TestDoubling:
    factor = 2

    def test_double_small(self):
        assert double(3) == 6

    def test_double_zero(self):
        assert double(0) == 0

    def test_double_uses_factor(self):
        assert double(5) == self.factor * 5


class DoublingCase(unittest.TestCase):
    def setUp(self):
        self.value = 21

    def test_setup_value(self):
        self.assertEqual(double(self.value), 42)

    def test_string_double(self):
        self.assertEqual(double("ab"), "abab")
"""
CLASS_P2P = [
    "tests/test_k.py::TestDoubling::test_double_small",
    "tests/test_k.py::TestDoubling::test_double_zero",
    "tests/test_k.py::TestDoubling::test_double_uses_factor",
    "tests/test_k.py::DoublingCase::test_setup_value",
    "tests/test_k.py::DoublingCase::test_string_double",
]


def _pytest_log(root: Path, rel: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", rel],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout


def _pytest(root: Path, rel: str, planted=()) -> dict[str, str]:
    out = canary.original_names(_pytest_log(root, rel), list(planted))  # drawn names read back
    return driver.parse_log_pytest_verbose(out) | {
        ln.split(" ", 2)[1]: ln.split(" ", 1)[0]
        for ln in out.splitlines()
        if ln.startswith(("PASSED ", "FAILED ", "ERROR "))
    }


def _harness_parser(name: str):
    pytest.importorskip("swebench")
    from swebench.harness.log_parsers import python as parsers

    fn = getattr(parsers, name)
    return lambda log: fn(log, None)


@pytest.mark.parametrize("seed", range(4))
def test_method_canaries_go_into_their_class_and_run_as_planned(tmp_path, seed):
    rel = "tests/test_k.py"
    (tmp_path / "tests").mkdir()
    got = canary_plan.plan_canaries({rel: CLASS_FILE}, CLASS_P2P, random.Random(seed))
    assert sorted(c.expect for c in got) == ["fail", "fail", "pass"], got
    assert all(c.cls in ("TestDoubling", "DoublingCase") for c in got)
    placed = canary_place.place(got, {rel: CLASS_FILE})
    assert len(placed) == 3 and set(placed.writes) == {rel}
    (tmp_path / rel).write_text(placed.writes[rel])
    statuses = _pytest(tmp_path, rel)
    assert canary.check_canaries(placed, statuses, 1) is None, (statuses, placed.writes[rel])
    assert all(statuses[t] == "PASSED" for t in CLASS_P2P)  # the real tests' outcomes are unchanged
    assert {c.test_id for c in placed} <= set(statuses)
    assert canary.without(statuses, placed) == {t: "PASSED" for t in CLASS_P2P}
    # the shell lines the evaluation runs write exactly that text, whatever bytes it holds
    (tmp_path / rel).write_text(CLASS_FILE)
    subprocess.run(["bash", "-c", canary_place.injection(placed)], cwd=tmp_path, check=True)
    assert (tmp_path / rel).read_text() == placed.writes[rel]


def test_a_check_gets_another_constant_and_the_opposite_only_where_no_constant_can_change():
    """``!=``/assertNotEqual pass exactly when the original fails (a flaky original makes a flaky canary),
    so they are the fallback, never the choice where a constant can change."""
    text = CLASS_FILE + (
        "\n\nclass PairCase(unittest.TestCase):\n    def test_pair(self):\n"
        "        self.assertEqual(double(2), double(1) * 2)\n\n    def test_flat(self):\n"
        "        assert double(4) == double(2) * 2\n"
    )
    p2p = CLASS_P2P[3:] + ["tests/test_k.py::PairCase::test_pair", "tests/test_k.py::PairCase::test_flat"]
    seen = {}
    for seed in range(40):
        for c in canary_plan.plan_canaries({"tests/test_k.py": text}, p2p, random.Random(seed), must_pass=0):
            assert c.source.count("self.assert") + c.source.count("assert ") >= 1
            seen.setdefault(c.cloned_from, set()).add(
                "negated" if ("assertNotEqual" in c.source or "!=" in c.source) else "constant"
            )
    assert seen == {
        "test_setup_value": {"constant"},
        "test_string_double": {"constant"},
        "test_pair": {"negated"},
        "test_flat": {"negated"},
    }, seen
    # SWE-smith's bug runs (negate=False): never the opposite check, so no canary from the pair case
    for seed in range(20):
        got = canary_plan.plan_canaries({"tests/test_k.py": text}, p2p, random.Random(seed), negate=False)
        assert got and not any("assertNotEqual" in c.source or "!=" in c.source for c in got)


def test_a_canary_whose_class_is_gone_renamed_or_reindented_is_dropped():
    got = canary_plan.plan_canaries(
        {"t.py": CLASS_FILE}, [t.replace("tests/test_k.py", "t.py") for t in CLASS_P2P]
    )
    assert (
        canary_place.place(
            got,
            {
                "t.py": CLASS_FILE.replace("class TestDoubling", "class Other").replace(
                    "class DoublingCase", "class Other2"
                )
            },
        )
        == canary.CanarySet()
    )
    reindented = CLASS_FILE.replace("\n    ", "\n  ")
    assert not canary_place.place(got, {"t.py": reindented})
    assert not canary_place.place(got, {"t.py": "def broken(:\n"})
    # a file whose text is not known (gone from the tree) carries none
    flat = "def test_a():\n    assert 1 + 1 == 2\n"
    mod = canary_plan.plan_canaries({"f.py": flat}, ["f.py::test_a"], must_pass=0)
    assert mod and canary_place.place(mod, {}) == canary.CanarySet()
    assert canary_place.place(mod, {"f.py": flat}).writes["f.py"].startswith(flat)


def test_canaries_sit_among_their_siblings_not_always_last():
    """A canary always appended (or always at its class's end) would be told by its place in the run."""
    rel = "tests/test_k.py"
    where = set()
    for seed in range(30):
        rng = random.Random(seed)
        placed = canary_place.place(
            canary_plan.plan_canaries({rel: CLASS_FILE}, CLASS_P2P, rng), {rel: CLASS_FILE}, rng
        )
        tree = ast.parse(placed.writes[rel])
        for c in placed:
            body = next(n for n in tree.body if getattr(n, "name", "") == c.cls).body
            names = [n.name for n in body if isinstance(n, ast.FunctionDef)]
            where.add((c.cls, names.index(c.name) == len(names) - 1))
    assert {("TestDoubling", False), ("TestDoubling", True), ("DoublingCase", False)} <= where, where


def test_a_class_another_class_derives_from_carries_none():
    text = CLASS_FILE + "\n\nclass TestMore(TestDoubling):\n    pass\n"
    got = canary_plan.plan_canaries(
        {"t.py": text}, [t.replace("tests/test_k.py", "t.py") for t in CLASS_P2P[:3]]
    )
    assert got == []


DJANGO_FILE = '''\\
from unittest import TestCase


class ArithmeticTests(TestCase):
    def test_sum_of_two(self):
        self.assertEqual(1 + 2, 3)

    def test_join_words(self):
        self.assertEqual("-".join(["a", "b"]), "a-b")

    def test_length_of_list(self):
        items = [1, 2, 3, 4]
        self.assertEqual(len(items), 4)

    def test_documented(self):
        """A docstring: unittest prints it, the harness keys the test by it."""
        self.assertEqual(2 * 2, 4)
'''


def _django_ids(names, long: bool) -> list[str]:
    return [f"{n} (arith.tests.ArithmeticTests{'.' + n if long else ''})" for n in names]


@pytest.mark.parametrize("long_ids", [False, True], ids=["py<3.11 ids", "py>=3.11 ids"])
def test_django_family_canaries_run_under_unittest_and_the_harness_parser(tmp_path, long_ids):
    parse = _harness_parser("parse_log_django")
    (tmp_path / "tests" / "arith").mkdir(parents=True)
    shutil.copy(RUNNERS / "runtests.py", tmp_path / "tests" / "runtests.py")
    (tmp_path / "tests" / "arith" / "__init__.py").write_text("")
    rel = "tests/arith/tests.py"
    p2p = _django_ids(["test_sum_of_two", "test_join_words", "test_length_of_list"], long_ids)
    p2p.append("A docstring: unittest prints it, the harness keys the test by it.")
    assert canary_plan.candidate_files(p2p, "", canary.DJANGO) == ["arith/tests.py", rel]
    got = canary_plan.plan_canaries(
        {rel: DJANGO_FILE, "arith/tests.py": None}, p2p, random.Random(3), family=canary.DJANGO
    )
    assert sorted(c.expect for c in got) == ["fail", "fail", "pass"] and {c.module for c in got} == {
        "arith.tests"
    }
    assert all(c.cloned_from != "test_documented" for c in got)  # keyed by its docstring: not clonable
    placed = canary_place.place(got, {rel: DJANGO_FILE})
    assert len(placed) == 3
    (tmp_path / rel).write_text(placed.writes[rel])
    run = subprocess.run(
        [sys.executable, "tests/runtests.py", "--verbosity", "2", rel],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    statuses = parse(run.stderr)
    assert canary.check_canaries(placed, statuses, run.returncode) is None, run.stderr
    assert set(canary.without(statuses, placed).values()) == {"PASSED"}
    assert len(canary.without(statuses, placed)) == 4
    # a forger that makes every test "ok" is named
    forged = {k: "PASSED" for k in statuses}
    assert canary.check_canaries(placed, forged, 0).startswith("runner_tampered")


SYMPY_FILE = """\\
def test_add_small():
    assert 2 + 3 == 5


def test_upper():
    assert "ab".upper() == "AB"


def test_len():
    assert len("abcd") == 4
"""


def test_sympy_family_canaries_run_under_bin_test_output_and_the_harness_parser(tmp_path):
    parse = _harness_parser("parse_log_sympy")
    (tmp_path / "bin").mkdir()
    (tmp_path / "pkg" / "tests").mkdir(parents=True)
    shutil.copy(RUNNERS / "sympy_bin.py", tmp_path / "bin" / "test")
    rel = "pkg/tests/test_small.py"
    cmd = f"bin/test -C --verbose {rel}"
    p2p = ["test_add_small", "test_upper", "test_len"]
    assert canary_plan.candidate_files(p2p, cmd, canary.SYMPY) == [rel]
    reserved = ["test_add_small_len"]  # another file's test of the same run: no canary may take its name
    for seed in range(10):
        got = canary_plan.plan_canaries(
            {rel: SYMPY_FILE},
            p2p,
            random.Random(seed),
            family=canary.SYMPY,
            test_command=cmd,
            reserved=reserved,
        )
        assert sorted(c.expect for c in got) == ["fail", "fail", "pass"]
        assert not {c.name for c in got} & set(reserved)
    placed = canary_place.place(got, {rel: SYMPY_FILE})
    assert len(placed) == 3
    (tmp_path / rel).write_text(SYMPY_FILE)
    subprocess.run(["bash", "-c", canary_place.injection(placed)], cwd=tmp_path, check=True)
    run = subprocess.run(
        [sys.executable, "bin/test", "-C", "--verbose", rel], cwd=tmp_path, capture_output=True, text=True
    )
    statuses = parse(run.stdout)
    assert canary.check_canaries(placed, statuses, run.returncode) is None, run.stdout
    assert canary.without(statuses, placed) == {t: "PASSED" for t in p2p}, run.stdout
    assert canary.check_canaries(placed, {k: "PASSED" for k in statuses}, 0).startswith("runner_tampered")


def test_families_by_the_harness_parser():
    pytest.importorskip("swebench")
    from swebench.harness.log_parsers import python as parsers

    fams = {name: canary.family_of(fn) for name, fn in vars(parsers).items() if name.startswith("parse_log_")}
    assert fams["parse_log_django"] == canary.DJANGO and fams["parse_log_sympy"] == canary.SYMPY
    assert {
        f for n, f in fams.items() if "pytest" in n or n in ("parse_log_matplotlib", "parse_log_seaborn")
    } == {canary.PYTEST}
    assert canary.family_of(None) is None


FIXTURE_FILE = """\
from unittest import mock

import pytest


def scale(x, by=2):
    return x * by


@pytest.fixture
def three():
    return 3


def test_scale_fixture(three):
    assert scale(three) == 6


@pytest.mark.usefixtures("three")
def test_scale_marked():
    assert scale(4) == 8


@mock.patch("os.getcwd", return_value="/x")
def test_scale_patched(getcwd):
    assert scale("ab") == "abab"


@pytest.mark.parametrize("n", [1, 2])
def test_scale_param(n):
    assert scale(n) == 2 * n


@pytest.mark.skipif(False, reason="never")
def test_scale_skippable():
    assert scale(1) == 2


def test_scale_new(three):
    assert [scale(three, 3), scale(1)] == [9, 2]


@pytest.mark.usefixtures("three")
def test_scale_approx():
    assert scale(0.5, 5) == pytest.approx(2.5)
"""
FIXTURE_P2P = [
    f"tests/test_f.py::{n}" for n in ("test_scale_fixture", "test_scale_marked", "test_scale_patched")
]
FIXTURE_F2P = ["tests/test_f.py::test_scale_new", "tests/test_f.py::test_scale_approx"]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("decoy", [False, True])
def test_tests_with_fixtures_and_marks_carry_canaries_and_twins(tmp_path, seed, decoy):
    """Fixture arguments and id-keeping decorators are cloned with the test; parametrize and skip marks
    never. The FAIL_TO_PASS tests (here passing already: the twins must still fail) get two twins each,
    beside them; in a decoy run each is replaced by a stand-in that fails too."""
    rel = "tests/test_f.py"
    (tmp_path / "tests").mkdir()
    got = canary_plan.plan_canaries(
        {rel: FIXTURE_FILE}, FIXTURE_P2P, random.Random(seed), fail_to_pass=FIXTURE_F2P, decoy=decoy
    )
    assert {c.cloned_from for c in got if c.of == canary.P2P} <= {t.split("::")[1] for t in FIXTURE_P2P}
    twins = [c for c in got if c.of == canary.F2P and not c.replaces]
    assert sorted(c.cloned_from for c in twins) == ["test_scale_approx"] * 2 + ["test_scale_new"] * 2
    own = {c.cloned_from: c for c in got if c.replaces}  # each test itself, under a drawn name
    assert sorted(own) == ["test_scale_approx", "test_scale_new"]
    assert all(c.expect == ("fail" if decoy else canary.ORIGINAL) and c.name not in own for c in own.values())
    placed = canary_place.place(got, {rel: FIXTURE_FILE}, random.Random(seed))
    assert len(placed) == len(got)
    text = placed.writes[rel]
    assert "def test_scale_new(" not in text and "def test_scale_approx(" not in text
    (tmp_path / rel).write_text(text)
    statuses = _pytest(tmp_path, rel, placed)
    assert canary.check_canaries(placed, statuses, 1) is None, (statuses, text)
    for name in ("test_scale_new", "test_scale_approx"):  # each twin sits next to its test or another twin
        cluster = {own[name].name} | {c.name for c in twins if c.cloned_from == name}
        order = [n.name for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)]
        at = sorted(order.index(n) for n in cluster)
        assert at == list(range(at[0], at[0] + len(cluster))), order
    if decoy:  # no original ran: the stand-ins fail under their drawn names
        assert not set(FIXTURE_F2P) & set(statuses)
        assert {statuses[c.test_id] for c in own.values()} == {"FAILED"}
    else:  # the originals ran under drawn names and read back under their own ids
        assert {t: statuses[t] for t in FIXTURE_F2P} == dict.fromkeys(FIXTURE_F2P, "PASSED")


def test_original_names_reads_each_family_back_under_the_tests_own_id():
    """A FAIL_TO_PASS test run under a drawn name is read back under its own id, in every form each
    family's parser keys it by, and nothing else in the log changes."""
    py = canary.Canary("t/test_a.py", "test_drawn_x", canary.ORIGINAL, "", "test_real", "K", canary.PYTEST)
    log = "PASSED t/test_a.py::K::test_drawn_x\nt/test_a.py::K::test_drawn_x PASSED\nPASSED t/test_b.py::K::test_drawn_x\n"
    assert canary.original_names(log, [py]) == (
        "PASSED t/test_a.py::K::test_real\nt/test_a.py::K::test_real PASSED\nPASSED t/test_b.py::K::test_drawn_x\n"
    )
    dj = canary.Canary(
        "tests/m/tests.py", "test_drawn", canary.ORIGINAL, "", "test_real", "C", canary.DJANGO, "m.tests"
    )
    assert canary.original_names(
        "test_drawn (m.tests.C) ... ok\ntest_drawn (m.tests.C.test_drawn) ... ok", [dj]
    ) == ("test_real (m.tests.C) ... ok\ntest_real (m.tests.C.test_real) ... ok")
    sy = canary.Canary("sympy/t.py", "test_drawn", canary.ORIGINAL, "", "test_real", "", canary.SYMPY)
    assert canary.original_names("test_drawn ok\ntest_drawnish ok", [sy]) == "test_real ok\ntest_drawnish ok"
    twin = canary.Canary("t/test_a.py", "test_twin", canary.MUST_FAIL, "", "test_real", "", canary.PYTEST)
    assert canary.original_names("FAILED t/test_a.py::test_twin", [twin]) == "FAILED t/test_a.py::test_twin"
