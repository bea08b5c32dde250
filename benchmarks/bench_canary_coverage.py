"""Benchmark: how often the canary planner can plant canaries in real projects' test files, old code vs new.

    .venv/bin/python benchmarks/bench_canary_coverage.py --mirror /work/.mirror
    .venv/bin/python benchmarks/bench_canary_coverage.py A.git B.git --files 40 --why 20 --old-rev 5731f48

Reads, at HEAD of each git directory given (bare mirrors will do; ``--mirror DIR``: every ``DIR/*/repo``, as
the ``fetch`` tool lays them out, named ``owner+name``), the test files (``test_*.py`` or ``*_test.py`` under
a ``test``, ``tests`` or ``testing`` directory), at most ``--files`` per project, every k-th of the sorted
list. For the planner at ``--old-rev`` (its ``canary_plan.py`` read from this repository with ``git show``)
and the working tree's, per file: whether ``plan_canaries`` plants a must-fail PASS_TO_PASS canary when the
PASS_TO_PASS ids are every test the file defines (parametrized ones as ``name[x]``, which it skips); per test
function (module level and in module-level classes): whether it could get FAIL_TO_PASS twins (clonable, and
its last check has an expected literal: new ``_check_literal``, old ``_failing_edit`` without negation).
``--why N``: why the new code gives the rest no twins, counted, and N of them drawn. Needs no network.
"""

from __future__ import annotations

import argparse
import ast
import collections
import random
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import sweflow.grading.canary  # noqa: F401  (the old module's relative import finds it)
from sweflow.grading import canary_plan as new
from sweflow.grading.canary import MUST_FAIL, P2P
from sweflow.grading.canary_literals import (
    _ASSERT_EQUAL,
    _REGEX_META,
    _check_literal,
    _self_call,
    parametrized,
)

ROOT = Path(__file__).resolve().parent.parent
TEST_DIRS = {"test", "tests", "testing"}
FN = (ast.FunctionDef, ast.AsyncFunctionDef)


def load_old(rev: str) -> types.ModuleType:
    """``canary_plan`` as of ``rev``, a module of its own that imports today's ``sweflow.grading.canary``."""
    src = subprocess.check_output(
        ["git", "-C", str(ROOT), "show", f"{rev}:sweflow/grading/canary_plan.py"], text=True
    )
    mod = types.ModuleType(f"sweflow.grading._canary_plan_{rev}")
    mod.__package__ = "sweflow.grading"
    sys.modules[mod.__name__] = mod
    exec(compile(src, f"{rev}:sweflow/grading/canary_plan.py", "exec"), mod.__dict__)  # noqa: S102
    return mod


def git(gd: Path, *args: str) -> str:
    return subprocess.check_output(["git", f"--git-dir={gd}", *args]).decode("utf-8", "replace")


def test_files(gd: Path, limit: int) -> list[str]:
    paths = sorted(
        p
        for p in git(gd, "ls-tree", "-r", "--name-only", "HEAD").splitlines()
        if p.endswith(".py")
        and TEST_DIRS & set(p.split("/")[:-1])
        and (p.rsplit("/", 1)[-1].startswith("test_") or p.endswith("_test.py"))
    )
    return paths[:: max(1, len(paths) // limit)][:limit]


_PARAM = re.compile(r"paramete?ri[sz]e")  # pytest's parametrize, parameterized's @parameterized.expand


def _param(node) -> bool:
    """Whether the decorators give it ids other than its name (``name[x]``, ``name_0_x``)."""
    return any(_PARAM.search(ast.unparse(d)) for d in node.decorator_list)


def defined_tests(tree: ast.Module):
    """(class, function node, parametrized) for each ``test*`` function at module level or in a class."""
    for node in tree.body:
        if isinstance(node, FN) and node.name.startswith("test"):
            yield "", node, _param(node)
        elif isinstance(node, ast.ClassDef):
            for m in node.body:
                if isinstance(m, FN) and m.name.startswith("test"):
                    yield node.name, m, _param(m) or _param(node)


_NAMES = {"Name": "a name", "Attribute": "a name", "JoinedStr": "an f-string"}


def _kind(node: ast.expr) -> str:
    if isinstance(node, ast.Constant):
        return "True/False/None" if node.value is None or isinstance(node.value, bool) else "odd literal"
    if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
        return f"display, {'names/calls' if any(isinstance(n, ast.Constant) for n in ast.walk(node)) else 'no literal'}"
    return _NAMES.get(type(node).__name__, "a " + type(node).__name__.lower())


def _self_method(s: ast.stmt) -> str:
    return _self_call(s.value) if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) else ""


def why_not(fn, cls: str, plain: dict, param: bool) -> str:
    """Why the new planner gives this test function no twins."""
    if param and (cls, fn.name) in plain and not parametrized(fn):
        return "parametrized by its class or @parameterized: no id is its name"
    if (cls, fn.name) not in plain:
        deco = " ".join(ast.unparse(d) for d in fn.decorator_list)
        m = new._UNCLONABLE_DECORATOR.search(deco)
        a = fn.args
        if isinstance(fn, ast.AsyncFunctionDef):
            return "not clonable: async def"
        if m:
            return f"not clonable: @{m.group(0).replace('parametrise', 'parametrize')}"
        if a.defaults or a.kwonlyargs or a.vararg or a.kwarg or a.posonlyargs:
            return "not clonable: arguments with defaults / * / **"
        if cls and [x.arg for x in a.args][:1] != ["self"]:
            return "not clonable: method without self (staticmethod)"
        if cls and ast.get_docstring(fn):
            return "not clonable: method with a docstring"
        return "not clonable: defined twice, base class, or other"
    checks = [s for s in fn.body if isinstance(s, (ast.Assert, ast.With)) or _self_method(s) in _ASSERT_EQUAL]
    if not checks:
        if any(_self_method(s).startswith("assert") for s in fn.body):
            return "no check: self.assertX other than assertEqual"
        if any(isinstance(n, ast.Assert) or "assert" in _self_method(n) for n in ast.walk(fn)):
            return "no check: asserts only nested (for/if/try/while)"
        if any(isinstance(n, ast.Call) and "assert" in ast.unparse(n.func).lower() for n in ast.walk(fn)):
            return "no check: only assert helpers (assert_eq, assert_allclose, ...)"
        return "no check: no assert at all (other helpers, mocks, no-raise)"
    last = checks[-1]
    if isinstance(last, ast.With):
        call = last.items[0].context_expr
        if not (isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "raises"):
            return "last check a with-block, not pytest.raises"
        match = next((k.value for k in call.keywords if k.arg == "match"), None)
        if match is None:
            return "pytest.raises without match"
        regex = isinstance(match, ast.Constant) and _REGEX_META.search(str(match.value))
        return f"pytest.raises match {'with regex characters' if regex else 'not a plain literal'}"
    if isinstance(last, ast.Assert):
        t = last.test
        if isinstance(t, ast.Compare):
            if len(t.ops) > 1:
                return "assert chained comparison"
            if not isinstance(t.ops[0], ast.Eq):
                return f"assert x {type(t.ops[0]).__name__} y"
            return f"assert x == <{_kind(t.comparators[0])}>" + (
                " (literal on the left)" if isinstance(t.left, ast.Constant) else ""
            )
        return "assert truthiness (" + type(t).__name__ + ")"
    call = last.value
    if len(call.args) != 2 or call.keywords:
        return "assertEqual with msg/keywords"
    return f"assertEqual(x, <{_kind(call.args[1])}>)"


def measure(gd: Path, files: list[str], old: types.ModuleType, why: list, name: str) -> collections.Counter:
    c: collections.Counter = collections.Counter()
    for path in files:
        text = git(gd, "show", f"HEAD:{path}")
        c["files"] += 1
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            c["unparsed"] += 1
            continue
        lines = text.split("\n")
        tests = [
            (cls, fn, p, f"{path}::{'::'.join(filter(None, [cls, fn.name]))}")
            for cls, fn, p in defined_tests(tree)
        ]
        ids = [i + ("[x]" if p else "") for _, _, p, i in tests]
        for tag, mod in (("old", old), ("new", new)):
            try:
                plan = mod.plan_canaries({path: text}, ids, random.Random(0))
            except Exception as e:  # noqa: BLE001 - counted, the benchmark goes on
                c[f"crash_{tag}"] += 1
                print(f"  {tag} planner crashed on {path}: {e!r}", file=sys.stderr)
                plan = []
            c[f"p2p_{tag}"] += any(k.of == P2P and k.expect == MUST_FAIL for k in plan)
        plain_old, plain_new = old._plain_tests(tree), new._plain_tests(tree)
        for cls, fn, p, tid in tests:  # a parametrized test's ids are not its name: no twins
            c["tests"] += 1
            key = (cls, fn.name)
            r = random.Random(0)
            if not p and plain_old.get(key) is fn:
                c["twin_old"] += old._failing_edit(fn, text, lines, r, negate=False, far=False) is not None
            if not p and plain_new.get(key) is fn and _check_literal(fn, text, lines, random.Random(0)):
                c["twin_new"] += 1
            else:
                why.append((f"{name}: {tid}", why_not(fn, cls, plain_new, p)))
    return c


def row(label: str, sha: str, c: collections.Counter, secs: float) -> str:
    f, n = c["files"], c["tests"]
    old_new = [f"{c[k]:>5} {100 * c[k] / d if d else 0:5.1f}%" for k, d in [("p2p_old", f), ("p2p_new", f)]]
    old_new += [
        f"{c[k]:>5} {100 * c[k] / d if d else 0:5.1f}%" for k, d in [("twin_old", n), ("twin_new", n)]
    ]
    return (
        f"{label:<30} {sha:<12} {f:>5} {old_new[0]} {old_new[1]} {n:>6} {old_new[2]} {old_new[3]} {secs:5.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gitdirs", nargs="*", type=Path, help="git directories of the projects (bare is fine)")
    ap.add_argument("--mirror", type=Path, help="a folder of fetched mirrors: every DIR/*/repo")
    ap.add_argument("--files", type=int, default=40, help="test files per project (default 40)")
    ap.add_argument("--old-rev", default="5731f48", help="the commit of the old planner (default 5731f48)")
    ap.add_argument("--why", type=int, default=20, help="untwinnable tests to draw and show (default 20)")
    args = ap.parse_args(argv)
    dirs = list(args.gitdirs) + (sorted(args.mirror.glob("*/repo")) if args.mirror else [])
    if not dirs:
        ap.error("no git directories: give some, or --mirror DIR")
    old = load_old(args.old_rev)
    t0 = time.perf_counter()
    head = f"{'project':<30} {'commit':<12} {'files':>5} {'P2P old':>11} {'P2P new':>11} {'tests':>6} {'twins old':>11} {'twins new':>11} {'s':>5}"
    print(head)
    total: collections.Counter = collections.Counter()
    why: list[tuple[str, str]] = []
    for gd in dirs:
        name = (gd.parent.name if gd.name == "repo" else gd.name.removesuffix(".git")).replace("+", "/", 1)
        files = test_files(gd, args.files)
        if not files:
            print(f"{name:<30} no test files", file=sys.stderr)
            continue
        t = time.perf_counter()
        c = measure(gd, files, old, why, name)
        total += c
        total["projects"] += 1
        print(row(name, git(gd, "rev-parse", "HEAD").strip()[:12], c, time.perf_counter() - t))
    print("-" * len(head))
    print(row(f"total ({total['projects']} projects)", "", total, time.perf_counter() - t0))
    print(
        f"unparsed files {total['unparsed']}; planner crashes: old {total['crash_old']}, new {total['crash_new']}"
    )
    if args.why and why:
        print(f"\nwhy {len(why)} test functions get no twins (new code):")
        for reason, k in collections.Counter(r for _, r in why).most_common():
            print(f"  {k:>6} {100 * k / len(why):5.1f}%  {reason}")
        print(f"\n{args.why} drawn at random:")
        for test, reason in sorted(random.Random(0).sample(why, min(args.why, len(why)))):
            print(f"  {test}\n      {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
