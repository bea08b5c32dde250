"""Canary planning: which tests of a row's test files can be cloned, and the clones (``plan_canaries``).

A clone keeps its original's formatting and gets a name built from its siblings' names, drawn at random per
evaluation; must-fail clones change the last equality check's constant (or negate it), FAIL_TO_PASS tests get
twin clusters (``canary_literals``) and run under drawn names. Placing is ``canary_place``'s.
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .canary import DJANGO, F2P, MUST_FAIL, MUST_PASS, ORIGINAL, P2P, PYTEST, SYMPY, Canary
from .canary_literals import _check_literal, _failing_edit, _offset, cluster, parametrize, parametrized

# a unit: (module, class, function) a P2P id names; module only for Django, class "" at module level
Unit = tuple[str, str, str]
_DJANGO_ID = re.compile(r"^(\w+) \(((?:\w+\.)+\w+)\)$")
_WORD_PY = re.compile(r"\S+\.py")


def _named_files(test_command: str) -> list[str]:
    return [w for w in _WORD_PY.findall(test_command) if not w.startswith("-")]


def units_by_file(
    pass_to_pass: Sequence[str], test_command: str = "", family: str = PYTEST, *, cases: bool = False
) -> dict[str, set[Unit]]:
    """The Python test files whose PASS_TO_PASS tests can be cloned, each with its tests as units.

    pytest: ``path::name`` or ``path::Class::name`` (with ``cases``, a parametrized test's ``name[...]``
    too: FAIL_TO_PASS twins), files the command names when it names any; Django:
    ``name (module.Class)``, the file ``tests/<module>.py`` (Django's layout) or ``<module>.py``; sympy:
    bare names, so every file the command names, with every name (only those it defines are cloned)."""
    out: dict[str, set[Unit]] = {}
    if family == PYTEST:
        for t in pass_to_pass:
            parts = t.split("::")
            if cases and parts[-1].endswith("]") and "[" in parts[-1]:
                parts[-1] = parts[-1][: parts[-1].index("[")]
            if 2 <= len(parts) <= 3 and parts[0].endswith(".py") and all(p.isidentifier() for p in parts[1:]):
                out.setdefault(parts[0], set()).add(("", parts[1] if len(parts) == 3 else "", parts[-1]))
        named = {f for f in out if f in test_command}
        if named or _named_files(test_command):
            out = {f: u for f, u in out.items() if f in named}
    elif family == DJANGO:
        for t in pass_to_pass:
            m = _DJANGO_ID.match(t)
            if not m:
                continue
            name, parts = m.group(1), m.group(2).split(".")
            if parts[-1] == name and len(parts) > 2:  # "name (module.Class.name)"
                parts = parts[:-1]
            module, cls = ".".join(parts[:-1]), parts[-1]
            rel = module.replace(".", "/") + ".py"
            for path in (f"tests/{rel}", rel):
                out.setdefault(path, set()).add((module, cls, name))
    elif family == SYMPY:
        names = {("", "", t) for t in pass_to_pass if t.isidentifier() and t.startswith("test")}
        out = {f: set(names) for f in _named_files(test_command)} if names else {}
    return out


def candidate_files(pass_to_pass: Sequence[str], test_command: str = "", family: str = PYTEST) -> list[str]:
    """Python test files holding PASS_TO_PASS tests the command runs (see ``units_by_file``)."""
    return sorted(units_by_file(pass_to_pass, test_command, family))


# decorators a clone may not carry: they change a test's ids (parametrize, parameterized.expand), its outcome (skips,
# expected failures), rerun it (flaky), or make it no test at all (fixture)
_UNCLONABLE_DECORATOR = re.compile(
    r"paramete?ri[sz]e|skip|xfail|expectedFailure|(?<!\w)fixture\b|flaky|rerun|repeat", re.I
)


def _plain(fn, method: bool, params: bool = False) -> bool:
    """``def test_x(...)`` a clone behaves exactly like: positional arguments without defaults (pytest's
    fixtures; ``self`` first in a class), decorators that keep its ids and its outcome (marks such as
    ``usefixtures``, ``mock.patch``, ``given``; with ``params``, ``pytest.mark.parametrize`` too)."""
    a = getattr(fn, "args", None)
    if not isinstance(fn, ast.FunctionDef) or a is None or not fn.name.startswith("test"):
        return False
    marks = [d for d in fn.decorator_list if not (params and parametrize(d))]
    if any(_UNCLONABLE_DECORATOR.search(ast.unparse(d)) for d in marks):
        return False
    if a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults:
        return False
    names = [x.arg for x in a.args]
    return names[:1] == ["self"] if method else "self" not in names


def _once(body) -> dict[str, list]:
    seen: dict[str, list] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            seen.setdefault(node.name, []).append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):  # `test_x = ...` rebinding a name
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name):
                    seen.setdefault(t.id, []).extend([None, None])
    return {n: nodes[0] for n, nodes in seen.items() if len(nodes) == 1}


def _plain_tests(
    tree: ast.Module, *, docstrings: bool = False, params: bool = False
) -> dict[tuple[str, str], ast.FunctionDef]:
    """(class, name) -> plain test (``_plain``) defined once: module-level functions, and methods of classes
    defined once (class "" for module level); a method with a docstring only with ``docstrings`` (pytest's
    runners never print it; unittest's verbose one prints its first line instead of the id)."""
    out: dict[tuple[str, str], ast.FunctionDef] = {}
    # a class another class of the module derives from would run a test put into it twice, once under
    # an id the host does not know
    bases = {
        b.id
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef)
        for b in n.bases
        if isinstance(b, ast.Name)
    }
    for name, node in _once(tree.body).items():
        if isinstance(node, ast.FunctionDef) and _plain(node, method=False, params=params):
            out[("", name)] = node
        elif isinstance(node, ast.ClassDef) and name not in bases:
            for mname, m in _once(node.body).items():
                if (
                    isinstance(m, ast.FunctionDef)
                    and _plain(m, method=True, params=params)
                    and (docstrings or not ast.get_docstring(m))
                ):
                    out[(name, mname)] = m
    return out


def _sibling_names(tree: ast.Module) -> set[str]:
    return {
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }


def _new_name(taken: set[str], siblings: Sequence[str], rng: random.Random) -> str:
    """A test name built from the words of two sibling test names, not yet taken in the module."""
    words = [n.split("_")[1:] for n in siblings if n.startswith("test_") and len(n.split("_")) > 1] or [
        ["case"]
    ]
    for _ in range(50):
        a, b = rng.choice(words), rng.choice(words)
        head = a[: rng.randint(1, max(1, len(a)))]
        tail = b[rng.randint(0, max(0, len(b) - 1)) :]
        parts = [w for w in head + tail if w]
        name = "test_" + "_".join(parts)
        if (
            name not in taken
            and name.isidentifier()
            and all(x != y for x, y in zip(parts, parts[1:], strict=False))
        ):
            return name
    while True:  # siblings too few to mix: a sibling's name with one of the module's words added
        name = "test_" + "_".join(rng.choice(words) + [rng.choice(rng.choice(words))])
        if name not in taken and name.isidentifier():
            return name
        name = f"{name}_{rng.randint(2, 9)}"
        if name not in taken:
            return name


def _renamed(fn: ast.FunctionDef, src: str, new: str) -> str:
    return re.sub(rf"^(\s*def\s+){re.escape(fn.name)}(\s*\()", rf"\g<1>{new}\g<2>", src, count=1, flags=re.M)


def first_line(fn: ast.FunctionDef) -> int:
    """The definition's first line: its first decorator's, or the ``def`` line."""
    return min([fn.lineno] + [d.lineno for d in fn.decorator_list])


# To a forger a clone is one more new test that fails without a fix, like the FAIL_TO_PASS tests, and the
# FAIL_TO_PASS tests have near-twins as the cloned tests do: a forger that tells clones by their twin in the
# committed file or in the file as run (constants and ``==``/``!=`` masked) and passes every other new test is
# caught by, or not paid past, the FAIL_TO_PASS twins (``tests/integration/test_attacks_runner.py``). What
# remains to such a forger is a guess, per FAIL_TO_PASS test that has twins, of which of the look-alike new
# tests is the original.
def plan_for_file(
    path: str,
    text: str,
    pass_to_pass: Sequence[str] | set[Unit],
    rng: random.Random,
    *,
    must_fail: int = 2,
    must_pass: int = 1,
    negate: bool = True,
    family: str = PYTEST,
    reserved: Iterable[str] = (),
    fail_to_pass: set[Unit] = frozenset(),
    twins: int = 0,
    per_test: int = 2,
    decoy: bool = False,
    rename: bool = False,
    taken: set[str] | None = None,
) -> list[Canary]:
    """Canaries for one test file (its text as the test command will run it), or [] if none can be made.

    ``pass_to_pass``: the file's units (``units_by_file``), or the row's PASS_TO_PASS ids (pytest ids).
    ``fail_to_pass``/``twins``: up to ``twins`` must-fail clones of the file's FAIL_TO_PASS tests with a
    changed constant (they fail without a fix, and with a correct one, whose value is the original's): a
    FAIL_TO_PASS test gets a near-twin as the cloned PASS_TO_PASS tests do, so "leave the tests that have
    a twin alone, pass the rest" forges nothing. ``reserved``: names no canary may take (a sympy run names
    tests without their file). Where the code under test may legitimately differ from the base (SWE-smith's
    bug runs: a broken function makes its tests fail), pass ``must_pass=0, negate=False``: a must-pass clone
    of a test the bug breaks would fail, and ``!=`` would pass once the bug changed the value."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    units = (
        pass_to_pass
        if isinstance(pass_to_pass, set)
        else units_by_file(pass_to_pass, "", family).get(path, set())
    )
    modules = {(c, n): m for m, c, n in units}
    f2p_modules = {(c, n): m for m, c, n in fail_to_pass}
    # FAIL_TO_PASS tests may be parametrized (pytest): a twin keeps the cases and moves each one's expectation;
    # PASS_TO_PASS clones stay unparametrized
    tests = _plain_tests(tree, docstrings=family == PYTEST, params=family == PYTEST)
    plain = {k: fn for k, fn in tests.items() if k in modules and not parametrized(fn)}
    f2p = {k: fn for k, fn in tests.items() if k in f2p_modules and k not in modules}
    if not plain and not (f2p and twins):
        return []
    lines = text.split("\n")
    taken = taken if taken is not None else set()
    taken |= _sibling_names(tree) | set(reserved)
    out: list[Canary] = []

    def clone(key, fn, expect, src, of, replaces=False):
        cls = key[0]
        scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls) if cls else tree
        siblings = sorted(
            n.name for n in ast.iter_child_nodes(scope) if getattr(n, "name", "").startswith("test")
        )
        new = _new_name(taken, siblings or sorted(n for n in taken if n.startswith("test")), rng)
        taken.add(new)
        module = (modules if of == P2P else f2p_modules)[key]
        out.append(
            Canary(
                path, new, expect, _renamed(fn, src, new), fn.name, cls, family, module, of, replaces,
                parametrized(fn),
            )
        )  # fmt: skip

    def failing(table, limit, of, **kw):
        keys = sorted(table)
        rng.shuffle(keys)
        made = 0
        for key in keys:
            if made >= limit:
                break
            fn = table[key]
            edit = _failing_edit(fn, text, lines, rng, **kw)
            if edit is None:
                continue
            s0 = _offset(lines, first_line(fn), 0)
            e0 = _offset(lines, fn.end_lineno, fn.end_col_offset)
            s, e, rep = edit
            clone(key, fn, MUST_FAIL, text[s0:s] + rep + text[e:e0], of)
            made += 1
        return keys

    keys = failing(plain, must_fail, P2P, negate=negate)
    f2p_keys = sorted(f2p)
    rng.shuffle(f2p_keys)
    left = twins
    for key in f2p_keys:
        if left < per_test or per_test < 1:
            break
        fn = f2p[key]
        want = _check_literal(fn, text, lines, rng)
        spans = sorted(want.spans, reverse=True) if want else []
        drawn = [cluster(text[s:e], per_test, rng, hide=decoy, ops=want.ops, ok=want.ok) for s, e in spans]
        if not drawn or not all(drawn):
            continue
        s0 = _offset(lines, first_line(fn), 0)
        e0 = _offset(lines, fn.end_lineno, fn.end_col_offset)
        sources = []
        for j in range(len(drawn[0])):  # twin j: every case's literal moved to its j-th neighbour
            src = text[s0:e0]
            for (s, e), values in zip(spans, drawn, strict=True):
                src = src[: s - s0] + values[j] + src[e - s0 :]
            sources.append(src)
        # the test itself: under a drawn name like its twins' (``rename``; read back under its own id),
        # and in a decoy run with its expected literal moved too, so no run shows an original
        own = sources.pop() if decoy else text[s0:e0]
        if rename:
            clone(key, fn, MUST_FAIL if decoy else ORIGINAL, own, F2P, replaces=True)
        elif decoy:
            out.append(
                Canary(
                    path, fn.name, MUST_FAIL, own, fn.name, key[0], family, f2p_modules[key], F2P, True,
                    parametrized(fn),
                )
            )  # fmt: skip
        for src in sources:
            clone(key, fn, MUST_FAIL, src, F2P)
        left -= per_test
    for key in keys[:must_pass]:
        fn = plain[key]
        src = text[_offset(lines, first_line(fn), 0) : _offset(lines, fn.end_lineno, fn.end_col_offset)]
        clone(key, fn, MUST_PASS, src, P2P)
    if not any(c.expect == MUST_FAIL for c in out):
        return []  # a must-pass canary alone proves nothing about a forger that passes everything
    rng.shuffle(out)
    return out


def plan_canaries(
    files: Mapping[str, str | None],
    pass_to_pass: Sequence[str],
    rng: random.Random | None = None,
    *,
    family: str = PYTEST,
    test_command: str = "",
    reserved: Iterable[str] = (),
    fail_to_pass: Sequence[str] = (),
    twins: int = 6,
    per_test: int = 2,
    decoy: bool = False,
    rename: bool | None = None,
    **counts: Any,
) -> list[Canary]:
    """Canaries for ``files`` (path -> text as run): clones of PASS_TO_PASS tests from the first file that
    can carry them, and up to ``twins`` near-twins of FAIL_TO_PASS tests from any of the files, ``per_test``
    for each FAIL_TO_PASS test that gets any; each such test runs under a drawn name too (a ``Canary`` with
    ``expect`` ORIGINAL, ``canary.original_names`` reads it back), unless the command names it (``rename``
    None) or ``rename`` is False. ``decoy``:
    a decoy run's plan, where each of those tests is itself replaced by one more twin
    (``Canary.replaces``), so no original is run."""
    rng = rng or random.SystemRandom()
    units = units_by_file(pass_to_pass, test_command, family)
    f2p_units = (
        units_by_file(fail_to_pass, test_command, family, cases=True) if fail_to_pass and twins else {}
    )
    # a parametrized test with PASS_TO_PASS cases was in HEAD: its twins' moved HEAD cases would show which
    # copy keeps HEAD's literals, so it gets none
    for path, old in units_by_file(pass_to_pass, test_command, family, cases=True).items():
        if path in f2p_units:
            f2p_units[path] -= old
    if rename is None:  # a command that names a FAIL_TO_PASS test would not run it under another name
        rename = not any(t.split("::")[-1].split(" ")[0] in test_command for t in fail_to_pass)
    paths = [p for p, t in files.items() if t and units.get(p)]
    rng.shuffle(paths)
    out: list[Canary] = []
    taken: dict[str, set[str]] = {}
    for path in paths:
        got = plan_for_file(
            path, files[path] or "", units[path], rng, family=family, reserved=reserved,
            fail_to_pass=f2p_units.get(path, set()), twins=twins, per_test=per_test, decoy=decoy,
            rename=rename, taken=taken.setdefault(path, set()), **counts,
        )  # fmt: skip
        if any(c.of == P2P and c.expect == MUST_FAIL for c in got):
            out = got
            break
        taken.pop(path)
    left = twins - sum(c.of == F2P and not c.replaces for c in out)
    others = [p for p, t in files.items() if t and f2p_units.get(p) and p not in {c.path for c in out}]
    rng.shuffle(others)
    for path in others:
        if left <= 0:
            break
        got = plan_for_file(
            path, files[path] or "", set(), rng, family=family, reserved=reserved, must_fail=0, must_pass=0,
            fail_to_pass=f2p_units[path], twins=left, per_test=per_test, decoy=decoy, rename=rename,
        )  # fmt: skip
        out += got
        left -= sum(not c.replaces for c in got)
    rng.shuffle(out)
    return out
