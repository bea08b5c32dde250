"""Canary tests (sweflow.grading.canary): planned from the sample's real test files, run by real pytest,
and the runner-finished check on SWE-smith's own upstream-resolved logs."""

from __future__ import annotations

import ast
import gzip
import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from swebench.harness.test_spec.test_spec import make_test_spec

from sweflow.grading import canary, canary_place, canary_plan
from sweflow.harness import driver
from sweflow.sample import load_task
from sweflow.sample.repo import clone_at, materialize_repo

UPSTREAM = Path(__file__).resolve().parents[1] / "fixtures" / "upstream" / "swesmith-cases.json.gz"
START, END = ">>>>> Start Test Output", ">>>>> End Test Output"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """The sample repository checked out at task 1's base commit, the test patch applied."""
    task = load_task("sweflow__calclib-1")
    tmp = tmp_path_factory.mktemp("canary")
    info = materialize_repo(tmp / "src")
    dest = clone_at(info.path, tmp / "work", task["base_commit"])
    subprocess.run(["git", "apply", "-"], cwd=dest, input=task["test_patch"].encode(), check=True)
    return dest, task


def _pytest(repo: Path, *files: str, planted=()) -> dict[str, str]:
    """Statuses of a real pytest run, FAIL_TO_PASS tests run under drawn names read back as the host does."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *files],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    out = canary.original_names(out, list(planted))
    return driver.parse_log_pytest_verbose(out) | {
        ln.split(" ", 2)[1]: ln.split(" ", 1)[0]
        for ln in out.splitlines()
        if ln.startswith(("PASSED ", "FAILED ", "ERROR "))
    }


def test_canaries_from_a_real_test_file_fail_and_pass_as_planned(repo):
    dest, task = repo
    path = "tests/test_tokenizer.py"
    text = (dest / path).read_text()
    got = canary_plan.plan_canaries({path: text}, task["PASS_TO_PASS"], random.Random(7))
    kinds = sorted(c.expect for c in got)
    assert kinds == ["fail", "fail", "pass"], got
    existing = {ln.split("(")[0][4:] for ln in text.splitlines() if ln.startswith("def ")}
    for c in got:
        assert c.name.startswith("test_") and c.name not in existing
        assert c.cloned_from in {t.split("::")[1] for t in task["PASS_TO_PASS"]}
        # the clone keeps its original's text: one name and (for must-fail) one expression changed
        original = text[text.index(f"def {c.cloned_from}(") :].split("\n\n\n")[0]
        differ = [a for a, b in zip(original.splitlines(), c.source.splitlines(), strict=True) if a != b]
        assert len(differ) == (2 if c.expect == "fail" else 1), (original, c.source)
    (dest / path).write_text(text + "\n\n" + "\n\n\n".join(c.source for c in got) + "\n")
    try:
        statuses = _pytest(dest, path)
    finally:
        (dest / path).write_text(text)
    assert canary.check_canaries(got, statuses, 1) is None, statuses
    # the real tests' outcomes are unchanged: every PASS_TO_PASS test of the file still passes
    assert all(statuses[t] == "PASSED" for t in task["PASS_TO_PASS"] if t.startswith(path))


def test_names_and_bodies_differ_per_draw(repo):
    dest, task = repo
    path = "tests/test_tokenizer.py"
    text = (dest / path).read_text()
    draws = {
        tuple(c.name for c in canary_plan.plan_canaries({path: text}, task["PASS_TO_PASS"]))
        for _ in range(20)
    }
    assert len(draws) >= 10


def _shape(fn_source: str) -> str:
    """A test function's body with every constant masked and ``!=`` read as ``==``: what a forger comparing
    new tests to the committed file's can see of a clone."""

    class Mask(ast.NodeTransformer):
        def visit_Constant(self, node):
            return ast.Constant(value=0)

        def visit_NotEq(self, node):
            return ast.Eq()

    body = ast.parse(textwrap.dedent(fn_source)).body[0].body
    return ast.dump(Mask().visit(ast.Module(body=body, type_ignores=[])))


@pytest.mark.parametrize("negate", [True, False])  # (False: SWE-smith's far constants)
def test_a_must_fail_clone_differs_from_its_original_in_values_only(repo, negate):
    """A changed constant never turns into a unary minus (``2`` -> ``-1``): a clone whose shape differs
    from every committed test's stands out, and the twin-aware forger in the runner attacks no-ops it."""
    dest, task = repo
    small = "".join(f"def test_v{v}():\n    assert len('x' * {v}) == {v}\n\n\n" for v in range(5))
    files = {p: (dest / p).read_text() for p in sorted({t.split("::")[0] for t in task["PASS_TO_PASS"]})}
    files["tests/test_small.py"] = small + "def test_f():\n    assert 0.5 * 1 == 0.5\n"
    p2p = list(task["PASS_TO_PASS"]) + [f"tests/test_small.py::test_v{v}" for v in range(5)]
    p2p.append("tests/test_small.py::test_f")
    seen = 0
    for path, text in files.items():
        originals = {
            n.name: ast.get_source_segment(text, n)
            for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.FunctionDef)
        }
        for seed in range(40):
            for c in canary_plan.plan_canaries(
                {path: text}, p2p, random.Random(seed), must_pass=0, negate=negate, twins=0
            ):
                assert _shape(c.source) == _shape(originals[c.cloned_from]), (path, seed, c.source)
                seen += 1
    assert seen >= 60


def test_a_forger_is_named_and_a_clean_run_is_not():
    c = [
        canary.Canary("t.py", "test_a", "fail", "", "test_x"),
        canary.Canary("t.py", "test_b", "pass", "", "test_y"),
    ]
    assert canary.check_canaries(c, {"t.py::test_a": "FAILED", "t.py::test_b": "PASSED"}, 1) is None
    assert "test_a (must fail) PASSED" in canary.check_canaries(
        c, {"t.py::test_a": "PASSED", "t.py::test_b": "PASSED"}, 0
    )
    assert "test_b (must pass) absent" in canary.check_canaries(c, {"t.py::test_a": "ERROR"}, 1)
    assert "exited 0" in canary.check_canaries(c, {"t.py::test_a": "FAILED", "t.py::test_b": "PASSED"}, 0)
    assert canary.without({"t.py::test_a": "FAILED", "t.py::real": "PASSED"}, c) == {"t.py::real": "PASSED"}


def test_files_without_plain_pass_to_pass_tests_carry_none():
    text = "import pytest\n\n@pytest.mark.parametrize('x', [1])\ndef test_p(x):\n    assert x == 1\n\n\nclass TestK:\n    @pytest.mark.xfail\n    def test_m(self):\n        assert 1 == 1\n"
    assert canary_plan.plan_canaries({"t.py": text}, ["t.py::test_p[1]", "t.py::TestK::test_m"]) == []
    # a mark that keeps the test's id and outcome goes with the clone
    slow = text.replace("xfail", "slow")
    got = canary_plan.plan_canaries({"t.py": slow}, ["t.py::test_p[1]", "t.py::TestK::test_m"], must_pass=0)
    assert got and all(c.cloned_from == "test_m" and "@pytest.mark.slow" in c.source for c in got)
    # a plain test without an `assert a == b` gives no must-fail canary, so none at all
    assert canary_plan.plan_canaries({"t.py": "def test_q():\n    assert True\n"}, ["t.py::test_q"]) == []


def test_the_script_gets_canaries_after_the_test_patch_and_before_the_tests(repo):
    _, task = repo
    inst = {
        **task,
        "repo": "psf/requests",
        "version": "2.0",
        "environment_setup_commit": task["base_commit"],
        "hints_text": "",
        "created_at": "",
    }
    script = make_test_spec(inst).eval_script
    assert canary_place.test_patch_of(script).strip() == task["test_patch"].strip()
    assert canary_plan.candidate_files(task["PASS_TO_PASS"], driver.test_section(script, START, END)) == [
        "tests/test_tokenizer.py"
    ]
    c = [
        canary.Canary("tests/test_tokenizer.py", "test_z", "fail", "def test_z():\n    assert 1 == 2\n", "q")
    ]
    out = canary_place.inject(script, c, START).split("\n")
    at = next(i for i, ln in enumerate(out) if ln.startswith("cat >> tests/test_tokenizer.py <<'EOF_"))
    assert at < next(i for i, ln in enumerate(out) if START in ln)
    assert at > max(i for i, ln in enumerate(out) if ln.startswith("EOF_114329324912"))


def test_apply_to_reads_the_file_as_the_test_patch_leaves_it(repo):
    dest, task = repo
    path = "tests/test_tokenizer.py"
    base = subprocess.run(
        ["git", "show", f"{task['base_commit']}:{path}"], cwd=dest, capture_output=True, text=True, check=True
    ).stdout
    assert canary_place.apply_to(path, base, task["test_patch"]) == (dest / path).read_text()
    assert canary_place.apply_to("tests/other.py", "x = 1\n", task["test_patch"]) == "x = 1\n"


def _upstream_logs():
    data = json.loads(gzip.decompress(UPSTREAM.read_bytes()))
    for case in data["cases"]:
        if case["parser"] != "parse_log_pytest":
            continue
        for key in ("log", "bug_log", "reference_log"):
            if key in case:
                yield f"{case['id']}:{key}", case[key]


@pytest.mark.parametrize("name,log", list(_upstream_logs()), ids=lambda v: v if len(v) < 80 else None)
def test_every_upstream_pytest_log_counts_as_a_finished_run(name, log):
    """A safety rule must not reject a real run: SWE-smith's logs (pytest -v, pytest-pretty's summary)."""
    assert canary.runner_finished(driver.test_section(log, START, END)) is None, name


def test_a_run_cut_before_its_summary_or_padded_with_passed_lines_is_not_finished():
    section = "PASSED a.py::test_x\nFAILED a.py::test_y - boom\n"
    assert canary.runner_finished(section).startswith("runner_not_finished: no pytest closing summary")
    finished = section + "==== 1 failed, 1 passed in 0.10s ====\n"
    assert canary.runner_finished(finished) is None
    assert canary.runner_finished("1 failed, 1 passed in 0.10s\n" + section) is None  # -q: bare line
    forged = section + "PASSED a.py::test_z\n==== 1 failed, 1 passed in 0.10s ====\n"
    assert "says 1 passed, the log has 2 PASSED lines" in canary.runner_finished(forged)
    assert canary.summary_expected("pytest -rA tests/x.py") and not canary.summary_expected("pytest -qq x")


def test_near_twins_of_fail_to_pass_tests_fail_without_the_fix_and_with_it(repo):
    """A FAIL_TO_PASS test's twin (another constant in its last check) fails either way: unfixed at the
    checks the fix is for, fixed at the changed constant; the real fix still passes its real tests."""
    dest, task = repo
    path = "tests/test_tokenizer.py"
    text = (dest / path).read_text()
    got = canary_plan.plan_canaries(
        {path: text}, task["PASS_TO_PASS"], random.Random(5), fail_to_pass=task["FAIL_TO_PASS"]
    )
    twins = [c for c in got if c.of == canary.F2P and c.expect != canary.ORIGINAL]
    assert twins and all(c.expect == "fail" for c in twins), got
    # each FAIL_TO_PASS test with twins runs under a drawn name too
    renamed = {c.cloned_from for c in got if c.expect == canary.ORIGINAL}
    assert renamed == {c.cloned_from for c in twins}
    assert {c.cloned_from for c in twins} <= {t.split("::")[1] for t in task["FAIL_TO_PASS"]}
    assert not any("!=" in c.source for c in twins)  # the opposite check would pass unfixed
    placed = canary_place.place(got, {path: text}, random.Random(5))
    (dest / path).write_text(placed.writes[path])
    try:
        unfixed = _pytest(dest, path, planted=placed)
        subprocess.run(["git", "apply", "-"], cwd=dest, input=task["patch"].encode(), check=True)
        fixed = _pytest(dest, path, planted=placed)
        subprocess.run(["git", "apply", "-R", "-"], cwd=dest, input=task["patch"].encode(), check=True)
    finally:
        (dest / path).write_text(text)
    for c in twins:
        assert unfixed[c.test_id] == "FAILED" and fixed[c.test_id] == "FAILED"
    assert (
        canary.check_canaries(placed, fixed, 1) is None and canary.check_canaries(placed, unfixed, 1) is None
    )
    # the FAIL_TO_PASS tests ran under drawn names and are read back under their own ids
    assert all(
        fixed[t] == "PASSED" for t in task["FAIL_TO_PASS"] + task["PASS_TO_PASS"] if t.startswith(path)
    )
    assert all(unfixed[t] == "FAILED" for t in task["FAIL_TO_PASS"])
    assert not {f"{path}::{n}" for n in renamed} & set(placed.writes[path].split())


def _sample_files(task, tmp: Path) -> tuple[Path, dict[str, str]]:
    info = materialize_repo(tmp / "src")
    dest = clone_at(info.path, tmp / "work", task["base_commit"])
    subprocess.run(["git", "apply", "-"], cwd=dest, input=task["test_patch"].encode(), check=True)
    paths = sorted({t.split("::")[0] for t in task["FAIL_TO_PASS"]})
    return dest, {p: (dest / p).read_text() for p in paths}


@pytest.mark.parametrize("iid", [f"sweflow__calclib-{n}" for n in range(1, 10)])
def test_twin_clusters_and_decoy_stand_ins_fail_with_and_without_every_sample_fix(tmp_path, iid):
    """On every sample task: each twin and each decoy stand-in fails with the gold fix (a twin the fix
    passes would mark an honest patch tampered), in real runs and decoy runs alike."""
    task = load_task(iid)
    dest, files = _sample_files(task, tmp_path)
    clustered = 0
    for seed, decoy in ((0, False), (1, True), (2, False), (3, True)):
        plan = canary_plan.plan_canaries(
            files, task["PASS_TO_PASS"], random.Random(seed), fail_to_pass=task["FAIL_TO_PASS"], decoy=decoy,
            must_fail=0, must_pass=0,
        )  # fmt: skip
        plan = [c for c in plan if c.of == canary.F2P]
        if not plan:
            continue
        clustered += 1
        placed = canary_place.place(plan, files, random.Random(seed))
        assert len(placed) == len(plan)
        assert any(c.replaces and c.expect == "fail" for c in placed) == decoy  # stand-ins in decoys only
        for path, text in placed.writes.items():
            (dest / path).write_text(text)
        try:
            unfixed = _pytest(dest, *placed.writes, planted=placed)
            subprocess.run(["git", "apply", "-"], cwd=dest, input=task["patch"].encode(), check=True)
            fixed = _pytest(dest, *placed.writes, planted=placed)
            subprocess.run(["git", "apply", "-R", "-"], cwd=dest, input=task["patch"].encode(), check=True)
        finally:
            for path, text in files.items():
                (dest / path).write_text(text)
        for c in (
            c for c in placed if c.expect != canary.ORIGINAL
        ):  # unfixed, a twin may hit the bug's value
            assert c.status_in(fixed) == "FAILED", (c, placed.writes)
            assert c.status_in(unfixed) in ("FAILED", "PASSED")
            if c.params:  # every case of a parametrized twin fails with the fix
                assert {fixed[k] for k in c.cases(fixed)} == {"FAILED"}
                own = [t for t in task["FAIL_TO_PASS"] if t.split("::")[-1].split("[")[0] == c.cloned_from]
                assert len(c.cases(fixed)) >= len(own) > 0
            assert not canary.forged_pass(placed, unfixed) or decoy  # an honest wrong patch is not named
        if not decoy:
            got = [fixed.get(t) for t in task["FAIL_TO_PASS"]]
            assert got == ["PASSED"] * len(got)
    # calclib-9's parametrized F2P test derives its expected text from its input (``match=text.split(...)``):
    # no literal to move; calclib-4's is parametrized with the literal in its body, calclib-2's compare with
    # constructed objects (Binary("^", Num(2), ...)): a moved argument literal
    assert (clustered > 0) == (iid != "sweflow__calclib-9")


@pytest.mark.parametrize(
    ("expected", "moves"),
    [
        ('Binary("^", Num(2), Name("a"))', True),  # constructors all the way down: a literal argument
        ("Point(x=1, y=-2)", True),
        ("Decimal('1.5')", True),
        ("len('abc')", False),  # a plain function may not change with its argument
        ("Node(len('abc'))", False),
        ("Node(make(1))", False),
        ("Node(a)", False),  # no literal to move
    ],
)
def test_an_expected_value_built_by_constructors_gets_a_moved_literal(expected, moves):
    import ast

    from sweflow.grading.canary_literals import _check_literal

    text = f"def test_x():\n    assert parse('2') == {expected}\n"
    fn = ast.parse(text).body[0]
    got = _check_literal(fn, text, text.split("\n"), random.Random(0))
    assert (got is not None) == moves
    if moves:
        assert ast.literal_eval(text[got.start : got.end]) is not None  # the span is one literal


def test_pytest_methods_with_a_docstring_are_clonable_unittest_ones_not():
    import ast

    from sweflow.grading.canary_plan import _plain_tests

    tree = ast.parse(
        'class TestA:\n    def test_x(self):\n        """Checks x."""\n        assert f() == 1\n'
    )
    assert ("TestA", "test_x") in _plain_tests(tree, docstrings=True)
    assert ("TestA", "test_x") not in _plain_tests(tree)  # unittest's verbose runner prints the docstring


_PARAM_TESTS = """import pytest

from mod import area, check


def test_base():
    assert area(0, 0) == 0


@pytest.mark.parametrize("w, h, expected", [(2, 3, 6), pytest.param(4, 5, 20, id="big"), (1, 7, 7)])
def test_area(w, h, expected):
    assert area(w, h) == expected


@pytest.mark.parametrize("value", [-1, -5])
def test_negative(value):
    with pytest.raises(ValueError, match="negative size"):
        check(value)


@pytest.mark.parametrize(("value", "message"), [(0, "empty size"), (99, "huge size")])
def test_message(value, message):
    with pytest.raises(ValueError, match=message):
        check(value)
"""
_BUGGY = "def area(w, h):\n    return w + h\n\n\ndef check(v):\n    return v\n"
_FIXED = (
    "def area(w, h):\n    return w * h\n\n\ndef check(v):\n    if v < 0:\n        raise ValueError('negative size')\n"
    "    if v == 0:\n        raise ValueError('empty size')\n    if v > 50:\n        raise ValueError('huge size')\n"
)


@pytest.mark.parametrize("decoy", [False, True])
def test_parametrized_fail_to_pass_tests_get_twins_whose_every_case_fails(tmp_path, decoy):
    """A parametrized FAIL_TO_PASS test gets twins too: its expected value in the body (``match="..."``) or in
    its cases (``== expected``, ``match=message``) moved in every case; each case of a twin fails with the
    fix and without it, and a forger that no-ops every new test passes them all (named)."""
    path = "tests/test_m.py"
    (tmp_path / "tests").mkdir()
    (tmp_path / path).write_text(_PARAM_TESTS)
    (tmp_path / "mod.py").write_text(_BUGGY)
    f2p = [f"{path}::test_area[2-3-6]", f"{path}::test_area[big]", f"{path}::test_area[1-7-7]"]
    f2p += [f"{path}::test_negative[-1]", f"{path}::test_negative[-5]"]
    f2p += [f"{path}::test_message[0-empty size]", f"{path}::test_message[99-huge size]"]
    plan = canary_plan.plan_canaries(
        {path: _PARAM_TESTS}, [f"{path}::test_base"], random.Random(3), fail_to_pass=f2p, decoy=decoy,
        twins=6, per_test=2,
    )  # fmt: skip
    twins = [c for c in plan if c.of == canary.F2P and c.expect == canary.MUST_FAIL]
    assert {c.cloned_from for c in twins} == {"test_area", "test_negative", "test_message"}
    assert all(c.params for c in twins)
    placed = canary_place.place(plan, {path: _PARAM_TESTS}, random.Random(3))
    assert len(placed) == len(plan)
    (tmp_path / path).write_text(placed.writes[path])
    unfixed = _pytest(tmp_path, path, planted=placed)
    (tmp_path / "mod.py").write_text(_FIXED)
    fixed = _pytest(tmp_path, path, planted=placed)
    for c in twins:
        assert len(c.cases(fixed)) in (2, 3), c
        assert {fixed[k] for k in c.cases(fixed)} == {"FAILED"}, (c, placed.writes[path])
        assert c.status_in(unfixed) == "FAILED"
    assert canary.check_canaries(placed, fixed, 1) is None
    logged = [t.split(" ")[0] for t in f2p]  # pytest's -rA lines, split at spaces as the harness parsers do
    assert not (set(canary.without(fixed, placed)) - {*logged, f"{path}::test_base"})  # no canary case left
    if not decoy:  # the originals ran under drawn names, read back under their own ids
        assert all(fixed[t] == "PASSED" for t in logged) and all(unfixed[t] == "FAILED" for t in logged)
    forged = {k: "PASSED" for k in fixed}  # a runner that no-ops every test
    assert canary.forged_pass(placed, forged, twins=True)
    assert canary.check_canaries(placed, forged, 0).startswith("runner_tampered")


def test_a_parameter_read_besides_the_check_is_not_moved():
    """``expected`` used as an input too (or a regex ``match=`` case) would make a moved case test something
    else: no twin."""
    from sweflow.grading.canary_literals import _check_literal

    for text in (
        "@pytest.mark.parametrize('x, expected', [(1, 2)])\ndef test_a(x, expected):\n"
        "    assert f(x, expected) == expected\n",
        "@pytest.mark.parametrize('m', ['a.b'])\ndef test_b(m):\n    with pytest.raises(E, match=m):\n        g()\n",
        "@pytest.mark.parametrize('x, expected', [(1, some_value)])\ndef test_c(x, expected):\n"
        "    assert f(x) == expected\n",
    ):
        fn = ast.parse(text).body[0]
        assert _check_literal(fn, text, text.split("\n"), random.Random(0)) is None, text


def test_a_parametrized_test_with_pass_to_pass_cases_gets_no_twin():
    """New cases of a parametrized test that HEAD has: a twin would move HEAD's cases too, and the copy that
    keeps HEAD's literals would be the original; none is made."""
    path = "tests/test_m.py"
    f2p = [f"{path}::test_area[2-3-6]", f"{path}::test_negative[-1]", f"{path}::test_negative[-5]"]
    p2p = [f"{path}::test_base", f"{path}::test_area[big]", f"{path}::test_area[1-7-7]"]
    plan = canary_plan.plan_canaries(
        {path: _PARAM_TESTS}, p2p, random.Random(1), fail_to_pass=f2p, twins=6, per_test=2
    )
    assert {c.cloned_from for c in plan if c.of == canary.F2P} == {"test_negative"}
