"""Canaries for the runner families beside pytest (issue 25), graded in real Docker and local sandboxes:
Django's (unittest's verbose runner, read by the harness's ``parse_log_django``) and sympy's (bin/test's
output shape, ``parse_log_sympy``). Each row is the sample task 1 (same base commit, same template, the
real gold fix) with a test patch that brings the runner and a test module of that family; the attacks
append to ``calclib/__init__.py``, which the test modules import. With the tamper scan off, the canaries
alone must catch each one; the gold fix still resolves with canaries planted in the file."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sweflow.grading.evaluate import evaluate_patch

try:
    from tests.integration.conftest_validation import metadata_for
    from tests.integration.test_attacks_reward import NO_TAMPER_SCAN, TASK, _init_with, env, task  # noqa: F401
except ModuleNotFoundError:  # pragma: no cover
    from conftest_validation import metadata_for  # type: ignore[no-redef]
    from test_attacks_reward import NO_TAMPER_SCAN, TASK, _init_with, env, task  # type: ignore[no-redef] # noqa: F401

pytestmark = [pytest.mark.integration]

RUNNERS = Path(__file__).resolve().parents[1] / "fixtures" / "runners"

DJANGO_TESTS = """\
from unittest import TestCase

from calclib.tokenizer import END, NUMBER, OP, tokenize


class TokenizerNumberTests(TestCase):
    def test_integer_value(self):
        self.assertEqual(tokenize("42")[0].value, 42)

    def test_token_count(self):
        tokens = tokenize("1 + 23")
        self.assertEqual(len(tokens), 4)

    def test_float_text(self):
        self.assertEqual(tokenize("3.25 .5")[0].text, "3.25")

    def test_name_text(self):
        self.assertEqual(tokenize("rate_2 * x")[0].text, "rate_2")

    def test_scientific_notation(self):
        tokens = tokenize("6.02e23 + 1E3")
        self.assertEqual([t.kind for t in tokens], [NUMBER, OP, NUMBER, END])
"""

SYMPY_TESTS = """\
from calclib.tokenizer import END, NUMBER, tokenize


def test_integer_value():
    assert tokenize("42")[0].value == 42


def test_token_count():
    assert len(tokenize("1 + 23")) == 4


def test_name_text():
    assert tokenize("rate_2 * x")[0].text == "rate_2"


def test_scientific_notation():
    assert [t.kind for t in tokenize("6.02e23")] == [NUMBER, END]
"""


def _dj(name: str) -> str:  # the id unittest prints on the sandboxes' Python (3.11)
    return f"{name} (tok_unit.tests.TokenizerNumberTests.{name})"


FAMILIES = {
    "django": {
        "repo": "sweflow/calclib-django",
        "parser": "parse_log_django",
        "test_cmd": "python tests/runtests.py --verbosity 2 --parallel 1",
        "files": {
            "tests/runtests.py": (RUNNERS / "runtests.py").read_text(),
            "tests/tok_unit/__init__.py": "",
            "tests/tok_unit/tests.py": DJANGO_TESTS,
        },
        "FAIL_TO_PASS": [_dj("test_scientific_notation")],
        "PASS_TO_PASS": [
            _dj(n) for n in ("test_integer_value", "test_token_count", "test_float_text", "test_name_text")
        ],
    },
    "sympy": {
        "repo": "sweflow/calclib-sympy",
        "parser": "parse_log_sympy",
        "test_cmd": "python bin/test -C --verbose",
        "files": {"bin/test": (RUNNERS / "sympy_bin.py").read_text(), "tests/test_tok_sym.py": SYMPY_TESTS},
        "FAIL_TO_PASS": ["test_scientific_notation"],
        "PASS_TO_PASS": ["test_integer_value", "test_token_count", "test_name_text"],
    },
}

# unittest's TestCase.run replaced: every test reports success (Django's runner is unittest's)
UNITTEST_RUN_NOOP = """
import unittest as _u
def _run(self, result=None):
    result.startTest(self)
    result.addSuccess(self)
    result.stopTest(self)
_u.TestCase.run = _run
"""

# read the test files the command names, print a passing line for every test defined there in the
# family's format (and a closing summary), exit 0 before any test runs
PRINT_EXIT = """
import os as _os, re as _re, sys as _sys
_lines = []
for _a in _sys.argv[1:]:
    if _a.endswith(".py") and _os.path.exists(_a) and "runtests" not in _a:
        _src = open(_a).read()
        _mod = _os.path.relpath(_a, "tests")[:-3].replace("/", ".")
        for _cls, _body in _re.findall(r"^class (\\w+)\\b.*?:\\n((?:[ \\t]+.*\\n|\\n)*)", _src, _re.M) or [("", _src)]:
            for _n in _re.findall(r"^\\s*def (test_\\w+)\\(", _body, _re.M):
                _lines.append("%s (%s.%s.%s) ... ok" % (_n, _mod, _cls, _n) if _cls else "%s ok" % _n)
_out = "\\n".join(_lines) + "\\n\\nRan %d tests in 0.01s\\n\\nOK\\n" % len(_lines)
_out += "tests finished: %d passed, in 0.01 seconds\\n" % len(_lines)
_os.write(2 if "runtests" in _sys.argv[0] else 1, _out.encode())  # the stream the runner prints to
_os._exit(0)
"""

ATTACKS = {
    "django": {"unittest_run_noop": UNITTEST_RUN_NOOP, "print_exit": PRINT_EXIT},
    "sympy": {"print_exit": PRINT_EXIT},
}


@pytest.fixture(scope="module")
def rows(env, task):
    """family -> (instance, metadata): task 1 with the family's test patch, graded by its parser."""
    env.harness.register_repos(
        {f["repo"]: {"0.1": {"python": "3.11", "test_cmd": f["test_cmd"]}} for f in FAMILIES.values()},
        {f["repo"]: f["parser"] for f in FAMILIES.values()},
    )
    out = {}
    base = task["base_commit"]
    for fam, spec in FAMILIES.items():
        inst = {
            **task,
            "instance_id": f"sweflow__calclib-{fam}-1",
            "repo": spec["repo"],
            "test_patch": env.make_patch(base, spec["files"]),
            "FAIL_TO_PASS": spec["FAIL_TO_PASS"],
            "PASS_TO_PASS": spec["PASS_TO_PASS"],
        }
        out[fam] = inst, metadata_for(env.harness, inst, env.templates[TASK], env.name)
    return out


def _evaluate(env, meta, patch, **kw):
    res = evaluate_patch(env.provider, env.templates[TASK], meta, patch, sandbox_timeout=300, **kw)
    assert res.error is None, res.error  # an infrastructure fault is not a verdict about the attack
    return res


@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_gold_resolves_with_canaries_planted(env, task, rows, fam):
    inst, meta = rows[fam]
    assert meta["harness"]["parser"] == FAMILIES[fam]["parser"]
    res = _evaluate(env, meta, task["patch"])
    assert (res.reward, res.failure_reason) == (1.0, None), (
        res.marker,
        res.canaries,
        res.output_tail[-2000:],
    )
    assert sorted(c["expect"] for c in res.canaries) == ["fail", "fail", "pass"], res.canaries
    assert all(c["got"] == ("PASSED" if c["expect"] == "pass" else "FAILED") for c in res.canaries)
    assert all(c["family"] == fam for c in res.canaries)
    if fam == "django":  # methods of the class, the file written whole
        assert {c["cls"] for c in res.canaries} == {"TokenizerNumberTests"}
    # every real test is reported, none of the canaries is in the evidence
    assert set(inst["FAIL_TO_PASS"] + inst["PASS_TO_PASS"]) <= set(res.statuses), res.statuses
    assert not {c["name"] for c in res.canaries} & {k.split(" ")[0] for k in res.statuses}


@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_empty_patch_keeps_its_own_reason(env, rows, fam):
    res = _evaluate(env, rows[fam][1], "")
    assert (res.reward, res.failure_reason) == (0.0, "fail_to_pass_failure"), (res.marker, res.canaries)


@pytest.mark.parametrize(
    "fam,name", [(f, n) for f in sorted(ATTACKS) for n in sorted(ATTACKS[f])], ids=lambda v: str(v)
)
@pytest.mark.parametrize("with_fix", [False, True], ids=["alone", "on_the_fix"])
def test_runner_attack_is_caught_by_the_canaries(env, task, rows, fam, name, with_fix):
    base = task["base_commit"]
    if with_fix:
        text = env.read_base(base, "calclib/__init__.py") + "\n" + textwrap.dedent(ATTACKS[fam][name])
        patch = env.make_patch(base, {"calclib/__init__.py": text}, on_top_of=task["patch"])
    else:
        patch = _init_with(env, task, ATTACKS[fam][name])
    res = _evaluate(env, rows[fam][1], patch, rules=NO_TAMPER_SCAN)
    assert (res.reward, res.resolved, res.failure_reason) == (0.0, False, "runner_tampered"), (
        res.marker,
        res.canaries,
        res.output_tail[-1500:],
    )


@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_without_canaries_the_forger_would_have_been_paid(env, task, rows, fam):
    """The hole the canaries close for these runners (so the tests above can fail)."""
    res = _evaluate(
        env, rows[fam][1], _init_with(env, task, PRINT_EXIT), rules=NO_TAMPER_SCAN, canaries=False
    )
    assert (res.reward, res.failure_reason) == (1.0, None), (res.marker, res.output_tail[-1500:])
