"""Twin literals: where a test writes its expected value, and the symmetric moves that make its twins.

``_check_literal`` finds the expected literal of a test's last check (``Expected``: span, allowed moves, a
guard); ``cluster`` draws twins as the other nodes of a random tree of moves; ``_failing_edit`` is the
must-fail edit of a PASS_TO_PASS clone. ``sweflow.grading.canary_plan`` uses them.
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Callable
from dataclasses import dataclass


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
    more: tuple[tuple[int, int], ...] = ()  # a parametrized test's other cases: each one's expected literal

    @property
    def spans(self) -> list[tuple[int, int]]:
        return [(self.start, self.end), *self.more]


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
        match = _raises_match(last)
        if isinstance(match, ast.Name):
            return _param_literals(fn, match.id, text, lines, regex=True)
        span = _literal_span(match, text, lines) if match is not None else None
        return Expected(*span, ops=("change",)) if span else None
    if isinstance(last, ast.Assert):
        cmp = last.test
        if isinstance(cmp, ast.Compare) and len(cmp.ops) == 1 and isinstance(cmp.ops[0], ast.Eq):
            return _expected(fn, cmp.comparators[0], text, lines, rng)
        return None
    call = last.value
    if len(call.args) != 2 or call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    return next((e for e in (_expected(fn, a, text, lines, rng) for a in call.args[::-1]) if e), None)


def _expected(fn: ast.FunctionDef, node: ast.expr, text: str, lines: list[str], rng) -> Expected | None:
    if isinstance(node, ast.Name):
        return _param_literals(fn, node.id, text, lines)
    return _expected_literal(node, text, lines, rng)


def parametrize(d: ast.expr) -> ast.Call | None:
    """The decorator as ``pytest.mark.parametrize(...)`` (or ``mark.parametrize``) call, or None."""
    f = d.func if isinstance(d, ast.Call) else None
    ok = isinstance(f, ast.Attribute) and f.attr == "parametrize" and isinstance(f.value, ast.Attribute)
    return d if ok and f.value.attr == "mark" and not any(k.arg == "indirect" for k in d.keywords) else None


def parametrized(fn: ast.FunctionDef) -> bool:
    """Whether a ``pytest.mark.parametrize`` decorator (``parametrize``) makes the test's cases."""
    return any(map(parametrize, fn.decorator_list))


def _argnames(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [n.strip() for n in node.value.split(",") if n.strip()]
    if isinstance(node, (ast.List, ast.Tuple)) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return [e.value for e in node.elts]
    return None


def _param_literals(
    fn: ast.FunctionDef, name: str, text: str, lines: list[str], *, regex: bool = False
) -> Expected | None:
    """Where a parametrized test's expected value ``name`` is written: the literal of each case in its
    ``pytest.mark.parametrize`` list (every case, plain literals only), when the body reads ``name`` only
    in its last check (so a moved value changes nothing but the expectation); ``regex``: a ``match=``
    text, letters changed only and regex-free."""
    reads = [n for st in fn.body for n in ast.walk(st) if isinstance(n, ast.Name) and n.id == name]
    if len(reads) != 1 or not isinstance(reads[0].ctx, ast.Load):
        return None
    for d in fn.decorator_list:
        call = parametrize(d)
        names = _argnames(call.args[0]) if call is not None and len(call.args) >= 2 else None
        if not names or name not in names:
            continue
        cases = call.args[1]
        if not isinstance(cases, (ast.List, ast.Tuple)) or not cases.elts:
            return None
        spans = []
        for case in cases.elts:
            if isinstance(case, ast.Call) and _callee(case) == "param":
                items = case.args
            else:
                items = [case] if len(names) == 1 else getattr(case, "elts", None)
            if items is None or len(items) != len(names) or any(isinstance(i, ast.Starred) for i in items):
                return None
            value = items[names.index(name)]
            sp = _literal_span(value, text, lines)
            if sp is None or (regex and not _regex_free(value)):
                return None
            spans.append(sp)
        return Expected(*spans[0], ops=("change",) if regex else _STRING_OPS, more=tuple(spans[1:]))
    return None


_REGEX_META = re.compile(r"[\\.^$*+?{}\[\]|()]")


def _regex_free(node: ast.expr) -> bool:
    """A text literal that ``re.search`` reads as itself (a ``match=`` text a letter change keeps plain)."""
    return (
        isinstance(node, ast.Constant) and isinstance(node.value, str) and not _REGEX_META.search(node.value)
    )


def _raises_match(node: ast.With) -> ast.expr | None:
    """The ``match=`` of a ``with pytest.raises(E, match=...):`` block: a regex-free text literal, or a
    name (a parameter's); else None."""
    if len(node.items) != 1 or not isinstance(node.items[0].context_expr, ast.Call):
        return None
    call = node.items[0].context_expr
    f = call.func
    if not (isinstance(f, ast.Attribute) and f.attr == "raises" and isinstance(f.value, ast.Name)):
        return None
    match = next((k.value for k in call.keywords if k.arg == "match"), None)
    return match if isinstance(match, ast.Name) or (match is not None and _regex_free(match)) else None


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


_BUILT = (ast.Call, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.Constant, ast.Name, ast.Attribute, ast.Load,
          ast.keyword, ast.UnaryOp, ast.USub)  # fmt: skip


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _constructed(node: ast.expr) -> bool:
    """An expected value built from literals, names and displays (nested ones too) and class constructors
    only (``Binary("^", Num(2), Name("a"))``, capitalised callees): a moved literal builds another value.
    Plain functions (``len``, ``str``, ``sorted``) may not change with it, so they are never read."""
    return all(isinstance(n, _BUILT) for n in ast.walk(node)) and all(
        _callee(n)[:1].isupper() for n in ast.walk(node) if isinstance(n, ast.Call)
    )


def _expected_literal(node: ast.expr, text: str, lines: list[str], rng: random.Random) -> Expected | None:
    """Where the expected value ``node`` is written with a literal: the literal itself (``-`` kept), one
    drawn from the literals of a list, tuple, set or dict display or a value built by constructors
    (``_constructed``), one of a
    constant arithmetic expression whose value a move changes, or any of these as ``approx``'s only
    argument when a move takes the value far outside approx's default tolerance; else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return (
            _expected_literal(node.operand, text, lines, rng)
            if isinstance(node.operand, ast.Constant)
            else None
        )
    if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.Call)) and _constructed(node):
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
