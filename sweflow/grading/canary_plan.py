"""Canary planning: which tests of a row's test files can be cloned, and the clones (``plan_canaries``).

A clone keeps its original's formatting and gets a name built from its siblings' names, drawn at random per
evaluation; must-fail clones change the last equality check's constant (or negate it), FAIL_TO_PASS tests get
near-twins. Where they go in the file is ``sweflow.grading.canary_place``'s.
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .canary import DJANGO, F2P, MUST_FAIL, MUST_PASS, P2P, PYTEST, SYMPY, Canary

# a unit: (module, class, function) a P2P id names; module only for Django, class "" at module level
Unit = tuple[str, str, str]
_DJANGO_ID = re.compile(r"^(\w+) \(((?:\w+\.)+\w+)\)$")
_WORD_PY = re.compile(r"\S+\.py")


def _named_files(test_command: str) -> list[str]:
    return [w for w in _WORD_PY.findall(test_command) if not w.startswith("-")]


def units_by_file(
    pass_to_pass: Sequence[str], test_command: str = "", family: str = PYTEST
) -> dict[str, set[Unit]]:
    """The Python test files whose PASS_TO_PASS tests can be cloned, each with its tests as units.

    pytest: ``path::name`` or ``path::Class::name`` (files the command names, when it names any); Django:
    ``name (module.Class)``, the file ``tests/<module>.py`` (Django's layout) or ``<module>.py``; sympy:
    bare names, so every file the command names, with every name (only those it defines are cloned)."""
    out: dict[str, set[Unit]] = {}
    if family == PYTEST:
        for t in pass_to_pass:
            parts = t.split("::")
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


# decorators a clone may not carry: they change a test's ids (parametrize), its expected outcome (skips,
# expected failures), rerun it (flaky), or make it no test at all (fixture)
_UNCLONABLE_DECORATOR = re.compile(
    r"parametri[sz]e|skip|xfail|expectedFailure|(?<!\w)fixture\b|flaky|rerun|repeat"
)


def _plain(fn, method: bool) -> bool:
    """``def test_x(...)`` a clone behaves exactly like: positional arguments without defaults (pytest's
    fixtures; ``self`` first in a class), decorators that keep its one id and its outcome (marks such as
    ``usefixtures``, ``mock.patch``, ``given``)."""
    a = getattr(fn, "args", None)
    if not isinstance(fn, ast.FunctionDef) or a is None or not fn.name.startswith("test"):
        return False
    if any(_UNCLONABLE_DECORATOR.search(ast.unparse(d)) for d in fn.decorator_list):
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


def _plain_tests(tree: ast.Module) -> dict[tuple[str, str], ast.FunctionDef]:
    """(class, name) -> plain test defined once: module-level functions, and methods of module-level
    classes defined once (class "" for module level)."""
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
        if isinstance(node, ast.FunctionDef) and _plain(node, method=False):
            out[("", name)] = node
        elif isinstance(node, ast.ClassDef) and name not in bases:
            for mname, m in _once(node.body).items():
                if isinstance(m, ast.FunctionDef) and _plain(m, method=True) and not ast.get_docstring(m):
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


def _offset(lines: list[str], lineno: int, col: int) -> int:
    """Character offset in the joined text of (1-based line, UTF-8 byte column)."""
    before = sum(len(ln) + 1 for ln in lines[: lineno - 1])
    return before + len(lines[lineno - 1].encode("utf-8")[:col].decode("utf-8", "replace"))


_STEPS = (1, 2, 3, 5, 7, 10)
_FAR_STEPS = (31, 40, 64, 89, 97, 1000)
_NUMBER = re.compile(r"^(\d+)(?:\.(\d+))?$")
_CLASSES = ("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789")


def _class_of(ch: str) -> str:
    return next((c for c in _CLASSES if ch in c), "")


def _unit(seg: str) -> int:
    """A number literal's step: its last non-zero digit's place (``1000.0`` moves by thousands, ``6.02``
    by hundredths), so twins are as round as the literal they come from; 1 for anything else."""
    digits = seg.replace(".", "")
    if not digits.isdigit() or not digits.strip("0"):
        return 1
    return 10 ** (len(digits) - len(digits.rstrip("0")))


_STRING_OPS = ("change", "add", "drop")


def _step(
    seg: str, rng: random.Random, far: bool = False, unit: int = 1, ops: tuple[str, ...] = _STRING_OPS
) -> str | None:
    """One move from a literal's text (an unsigned int or decimal, or a quoted string) to another of the
    same shape, or None. Moves are symmetric: the move back is as likely (a number's last digit place
    up or down by the same step; a letter changed, or one added or dropped, with equal chances), so a
    run of moves does not tell where it started. Signs stay: ``-1`` is a unary minus on ``1``."""
    m = _NUMBER.match(seg.replace("_", "")) if "_" not in seg else None
    if m:
        whole, frac = m.group(1), m.group(2)
        digits = len(frac or "")
        scaled = int(whole + (frac or ""))
        new = scaled + rng.choice(_FAR_STEPS if far else _STEPS) * rng.choice((-1, 1)) * unit
        if new < 0:
            return None
        if not digits:
            return str(new)
        text = str(new).rjust(digits + 1, "0")
        return f"{text[:-digits]}.{text[-digits:]}"
    q = seg[:1]
    if len(seg) < 2 or q not in "'\"" or seg[-1] != q or "\\" in seg or "\n" in seg:
        return None
    body = seg[1:-1]
    if q in body:
        return None
    op = rng.choice(ops)
    if op == "drop":
        i = [k for k, ch in enumerate(body) if _class_of(ch)]
        if not i:
            return None
        k = rng.choice(i)
        return q + body[:k] + body[k + 1 :] + q
    if op == "change":
        i = [k for k, ch in enumerate(body) if _class_of(ch)]
        if not i:
            return None
        k = rng.choice(i)
        pool = _class_of(body[k]).replace(body[k], "")
        return q + body[:k] + rng.choice(pool) + body[k + 1 :] + q
    k = rng.randint(0, len(body))
    near = [body[j] for j in (k - 1, k) if 0 <= j < len(body) and _class_of(body[j])]
    return q + body[:k] + rng.choice(_class_of(rng.choice(near)) if near else _CLASSES[0]) + body[k:] + q


def _mutated_constant(seg: str, rng: random.Random, far: bool = False) -> str | None:
    """Another literal of the same shape as ``seg`` (a literal's text), or None."""
    for _ in range(20):
        new = _step(seg, rng, far, _unit(seg))
        if new is not None and new != seg:
            return new
    return None


def cluster(
    seg: str,
    size: int,
    rng: random.Random,
    *,
    hide: bool = False,
    ops: tuple[str, ...] = _STRING_OPS,
    ok: Callable[[str], bool] | None = None,
) -> list[str] | None:
    """``size`` literals near ``seg``, all different from it and from each other, or None.

    They are the other nodes of a random tree of ``size + 1`` nodes, ``seg`` at a node drawn uniformly,
    each edge one symmetric move (``_step``): seen together with ``seg``, which one was the start is no
    more likely than any other (median, extremes, the one nearest the rest all tell nothing). ``hide``
    (a decoy run): a tree of ``size + 2`` nodes, ``seg``'s node left out, so no literal shown is ``seg``.
    ``ops``: the string moves allowed (a regex to match keeps to ``change``: a dropped letter would still
    match); ``ok``: what every literal shown must satisfy (a tree with one that does not is drawn again)."""
    n, unit = size + (2 if hide else 1), _unit(seg)
    for _ in range(50):
        parent = [None] + [rng.randrange(i) for i in range(1, n)]
        nodes = list(range(n))
        rng.shuffle(nodes)  # node labels at random: ``seg`` sits at a uniform node of a random tree
        adj: dict[int, list[int]] = {i: [] for i in range(n)}
        for i in range(1, n):
            adj[nodes[i]].append(nodes[parent[i]])
            adj[nodes[parent[i]]].append(nodes[i])
        start = rng.randrange(n)
        value = {start: seg}
        todo = [start]
        while todo:
            a = todo.pop()
            for b in adj[a]:
                if b not in value:
                    value[b] = _step(value[a], rng, unit=unit, ops=ops) or ""
                    todo.append(b)
        out = [v for k, v in value.items() if k != start]
        out = out[: size + (1 if hide else 0)]
        if all(out) and seg not in out and len(set(out)) == len(out) and (ok is None or all(map(ok, out))):
            rng.shuffle(out)
            return out
    return None


def _literal_span(node: ast.expr, text: str, lines: list[str]) -> tuple[int, int] | None:
    """(start, end) of a literal ``node`` written plainly (a number or a one-line quoted string)."""
    if not isinstance(node, ast.Constant) or isinstance(node.value, bool) or node.value is None:
        return None
    s = _offset(lines, node.lineno, node.col_offset)
    e = _offset(lines, node.end_lineno, node.end_col_offset)
    seg = text[s:e]
    if isinstance(node.value, str) and seg[:1] not in "'\"":
        return None  # a prefixed or implicitly joined string
    return s, e


def _constant_edit(node: ast.expr, text: str, lines: list[str], rng: random.Random, far: bool):
    """(start, end, replacement) writing another constant in place of ``node``, or None."""
    span = _literal_span(node, text, lines)
    if span is None:
        return None
    new = _mutated_constant(text[span[0] : span[1]], rng, far=far)
    return (span[0], span[1], new) if new is not None else None


_ASSERT_EQUAL = {"assertEqual": "assertNotEqual", "assertEquals": "assertNotEqual"}


def _failing_edit(
    fn: ast.FunctionDef,
    text: str,
    lines: list[str],
    rng: random.Random,
    negate: bool = True,
    far: bool | None = None,
) -> tuple[int, int, str] | None:
    """(start, end, replacement) that makes the function's last top-level equality check fail (``assert
    x == y``, or ``self.assertEqual(x, y)`` in a method): another expected constant, or (``negate``) the
    opposite check, which is only sound while the tested code is the base's, and only where no constant
    can change: ``!=`` passes exactly when the original would fail, so a flaky original makes a flaky
    canary, where a changed constant stays failing. ``far`` (default: not ``negate``): a constant no
    off-by-one bug would produce."""
    far = (not negate) if far is None else far
    checks = [
        s
        for s in fn.body
        if isinstance(s, ast.Assert)
        or (
            isinstance(s, ast.Expr)
            and isinstance(s.value, ast.Call)
            and isinstance(s.value.func, ast.Attribute)
            and isinstance(s.value.func.value, ast.Name)
            and s.value.func.value.id == "self"
            and s.value.func.attr in _ASSERT_EQUAL
        )
    ]
    if not checks:
        return None
    last, options = checks[-1], []
    if isinstance(last, ast.Expr):
        call = last.value
        if len(call.args) < 2 or call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
            return None
        for arg in call.args[1::-1]:
            edit = _constant_edit(arg, text, lines, rng, far=far)
            if edit:
                options.append(edit)
                break
        if negate and not options:
            e = _offset(lines, call.func.end_lineno, call.func.end_col_offset)
            options.append((e - len(call.func.attr), e, _ASSERT_EQUAL[call.func.attr]))
        return rng.choice(options) if options else None
    cmp = last.test
    if not (isinstance(cmp, ast.Compare) and len(cmp.ops) == 1 and isinstance(cmp.ops[0], ast.Eq)):
        return None
    right = cmp.comparators[0]
    edit = _constant_edit(right, text, lines, rng, far=far)
    if edit:
        return edit
    left_end = _offset(lines, cmp.left.end_lineno, cmp.left.end_col_offset)
    right_start = _offset(lines, right.lineno, right.col_offset)
    between = text[left_end:right_start]
    if negate and between.count("==") == 1:
        i = left_end + between.index("==")
        options.append((i, i + 2, "!="))
    return rng.choice(options) if options else None


def _self_call(call: ast.Call) -> str:
    """The method name of a ``self.<name>(...)`` call, or ''."""
    f = call.func
    return (
        f.attr
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self"
        else ""
    )


@dataclass(frozen=True)
class Expected:
    """Where a test writes its expected value as a literal: the literal's span, the string moves allowed,
    and what a moved literal must satisfy for the check to fail whatever the code returns."""

    start: int
    end: int
    ops: tuple[str, ...] = _STRING_OPS
    ok: Callable[[str], bool] | None = None


def _check_literal(fn: ast.FunctionDef, text: str, lines: list[str], rng: random.Random) -> Expected | None:
    """The expected literal of the function's last top-level check: an equality (``assert x == <e>``,
    ``self.assertEqual(x, <e>)`` either way round, ``<e>`` as ``_expected_literal`` reads it), or a
    ``with pytest.raises(E, match="<text>"):`` block's message (letters changed only, regex-free text)."""
    checks = [
        s
        for s in fn.body
        if isinstance(s, (ast.Assert, ast.With))
        or (
            isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and _self_call(s.value) in _ASSERT_EQUAL
        )
    ]
    if not checks:
        return None
    last = checks[-1]
    if isinstance(last, ast.With):
        return _raises_match(last, text, lines)
    if isinstance(last, ast.Assert):
        cmp = last.test
        if isinstance(cmp, ast.Compare) and len(cmp.ops) == 1 and isinstance(cmp.ops[0], ast.Eq):
            return _expected_literal(cmp.comparators[0], text, lines, rng)
        return None
    call = last.value
    if len(call.args) != 2 or call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    return next((e for e in (_expected_literal(a, text, lines, rng) for a in call.args[::-1]) if e), None)


_REGEX_META = re.compile(r"[\\.^$*+?{}\[\]|()]")


def _raises_match(node: ast.With, text: str, lines: list[str]) -> Expected | None:
    if len(node.items) != 1 or not isinstance(node.items[0].context_expr, ast.Call):
        return None
    call = node.items[0].context_expr
    f = call.func
    if not (isinstance(f, ast.Attribute) and f.attr == "raises" and isinstance(f.value, ast.Name)):
        return None
    match = next((k.value for k in call.keywords if k.arg == "match"), None)
    if (
        not isinstance(match, ast.Constant)
        or not isinstance(match.value, str)
        or _REGEX_META.search(match.value)
    ):
        return None
    span = _literal_span(match, text, lines)
    return Expected(*span, ops=("change",)) if span else None


_ARITH = (ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.USub, ast.UAdd)


def _arith_value(expr: str) -> float | None:
    """The value of a constant arithmetic expression (``(32 / 7) ** 0.5``), or None."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return None
    for n in ast.walk(tree.body):
        if not isinstance(n, (*_ARITH, ast.Pow, ast.FloorDiv, ast.Mod)):
            return None
        if isinstance(n, ast.Constant) and (
            isinstance(n.value, bool) or not isinstance(n.value, (int, float))
        ):
            return None
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow):
            if not (isinstance(n.right, ast.Constant) and abs(n.right.value) <= 64):
                return None
    try:
        return float(eval(compile(tree, "<expected>", "eval"), {"__builtins__": {}}))  # noqa: S307 - constants only
    except (ArithmeticError, ValueError, OverflowError):
        return None


def _expected_literal(node: ast.expr, text: str, lines: list[str], rng: random.Random) -> Expected | None:
    """Where the expected value ``node`` is written with a literal: the literal itself (``-`` kept), one
    drawn from the literals of a list, tuple, set or dict display (nested displays too), one of a
    constant arithmetic expression whose value a move changes, or any of these as ``approx``'s only
    argument when a move takes the value far outside approx's default tolerance; else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return (
            _expected_literal(node.operand, text, lines, rng)
            if isinstance(node.operand, ast.Constant)
            else None
        )
    if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
        shapes = (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.Constant, ast.Name, ast.Attribute, ast.Load)
        if not all(isinstance(n, (*shapes, ast.UnaryOp, ast.USub)) for n in ast.walk(node)):
            return None
        found = [
            sp
            for n in ast.walk(node)
            if isinstance(n, ast.Constant)
            for sp in [_literal_span(n, text, lines)]
            if sp
        ]
        return Expected(*rng.choice(found)) if found else None
    f = node.func if isinstance(node, ast.Call) else None
    if (isinstance(f, ast.Name) and f.id == "approx") or (
        isinstance(f, ast.Attribute) and f.attr == "approx"
    ):
        if len(node.args) != 1 or node.keywords:
            return None
        inner = node.args[0]
        s0, e0 = (
            _offset(lines, inner.lineno, inner.col_offset),
            _offset(lines, inner.end_lineno, inner.end_col_offset),
        )
        before = _arith_value(text[s0:e0])
        got = _expected_literal(inner, text, lines, rng) if before is not None else None
        if got is None:
            return None

        def far(seg: str) -> bool:  # approx's default: rel 1e-6, so a thousandth apart is far outside it
            after = _arith_value(text[s0 : got.start] + seg + text[got.end : e0])
            return after is not None and abs(after - before) > 1e-3 * max(abs(before), 1e-9)

        return Expected(got.start, got.end, got.ops, far)
    if isinstance(node, ast.BinOp):
        s0, e0 = (
            _offset(lines, node.lineno, node.col_offset),
            _offset(lines, node.end_lineno, node.end_col_offset),
        )
        before = _arith_value(text[s0:e0])
        leaves = [n for n in ast.walk(node) if isinstance(n, ast.Constant)]
        sp = _literal_span(rng.choice(leaves), text, lines) if before is not None and leaves else None
        if sp is None:
            return None

        def moved(seg: str) -> bool:
            after = _arith_value(text[s0 : sp[0]] + seg + text[sp[1] : e0])
            return after is not None and after != before

        return Expected(*sp, ok=moved)
    sp = _literal_span(node, text, lines)
    return Expected(*sp) if sp else None


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
    tests = _plain_tests(tree)
    plain = {k: fn for k, fn in tests.items() if k in modules}
    f2p = {k: fn for k, fn in tests.items() if k in f2p_modules and k not in modules}
    if not plain and not (f2p and twins):
        return []
    lines = text.split("\n")
    taken = taken if taken is not None else set()
    taken |= _sibling_names(tree) | set(reserved)
    out: list[Canary] = []

    def clone(key, fn, expect, src, of):
        cls = key[0]
        scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls) if cls else tree
        siblings = sorted(
            n.name for n in ast.iter_child_nodes(scope) if getattr(n, "name", "").startswith("test")
        )
        new = _new_name(taken, siblings or sorted(n for n in taken if n.startswith("test")), rng)
        taken.add(new)
        module = (modules if of == P2P else f2p_modules)[key]
        out.append(Canary(path, new, expect, _renamed(fn, src, new), fn.name, cls, family, module, of))

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
        values = (
            cluster(text[want.start : want.end], per_test, rng, hide=decoy, ops=want.ops, ok=want.ok)
            if want
            else None
        )
        if not values:
            continue
        s0 = _offset(lines, first_line(fn), 0)
        e0 = _offset(lines, fn.end_lineno, fn.end_col_offset)
        sources = [text[s0 : want.start] + v + text[want.end : e0] for v in values]
        if decoy:  # the test itself, its expected literal moved too: no original in this run
            src = sources.pop()
            out.append(
                Canary(path, fn.name, MUST_FAIL, src, fn.name, key[0], family, f2p_modules[key], F2P, True)
            )
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
    **counts: Any,
) -> list[Canary]:
    """Canaries for ``files`` (path -> text as run): clones of PASS_TO_PASS tests from the first file that
    can carry them, and up to ``twins`` near-twins of FAIL_TO_PASS tests from any of the files, ``per_test``
    for each FAIL_TO_PASS test that gets any. ``decoy``: a decoy run's plan, where each of those tests is
    itself replaced by one more twin under its own name (``Canary.replaces``), so no original is run."""
    rng = rng or random.SystemRandom()
    units = units_by_file(pass_to_pass, test_command, family)
    f2p_units = units_by_file(fail_to_pass, test_command, family) if fail_to_pass and twins else {}
    paths = [p for p, t in files.items() if t and units.get(p)]
    rng.shuffle(paths)
    out: list[Canary] = []
    taken: dict[str, set[str]] = {}
    for path in paths:
        got = plan_for_file(
            path, files[path] or "", units[path], rng, family=family, reserved=reserved,
            fail_to_pass=f2p_units.get(path, set()), twins=twins, per_test=per_test, decoy=decoy,
            taken=taken.setdefault(path, set()), **counts,
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
            fail_to_pass=f2p_units[path], twins=left, per_test=per_test, decoy=decoy,
        )  # fmt: skip
        out += got
        left -= sum(not c.replaces for c in got)
    rng.shuffle(out)
    return out
