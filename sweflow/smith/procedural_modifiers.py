"""The procedural modifiers: per modifier, a site finder over a copied entity and an applier for one site.

An applier edits the entity's AST in place and returns the explanation of its change, or None when it
changed nothing; `sweflow.smith.procedural` picks the sites, unparses and splices the result.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Callable
from typing import Any

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_DEFS = (*_FUNCS, ast.ClassDef)
_TRY = (ast.Try, getattr(ast, "TryStar", ast.Try))
_FAMILIES: tuple[tuple[type, ...], ...] = (
    (ast.Add, ast.Sub), (ast.Mult, ast.Div, ast.FloorDiv, ast.Mod), (ast.Lt, ast.LtE, ast.Gt, ast.GtE),
    (ast.Eq, ast.NotEq), (ast.Is, ast.IsNot), (ast.In, ast.NotIn), (ast.And, ast.Or),
    (ast.BitAnd, ast.BitOr, ast.BitXor), (ast.LShift, ast.RShift),
)  # fmt: skip
_FAMILY = {op: fam for fam in _FAMILIES for op in fam}
_SYMBOL = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
    ast.Pow: "**", ast.MatMult: "@", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
    ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in",
    ast.And: "and", ast.Or: "or", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
    ast.LShift: "<<", ast.RShift: ">>",
}  # fmt: skip
_NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.MatMult, ast.LShift, ast.RShift)
_SYMMETRIC_COMPARE = (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)


# ---- helpers over a (copied) entity


def _walk(root: ast.AST):
    """The entity node and everything in its body (not its decorators, arguments or annotations)."""
    yield root
    for stmt in root.body:
        yield from ast.walk(stmt)


def _bodies(root: ast.AST):
    """(owner, statement list, first index that may change) for every statement list under `root`."""
    for node in _walk(root):
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                yield node, body, _doc_offset(node, body)


def _doc_offset(owner: ast.AST, body: list[ast.stmt]) -> int:
    first = body[0]
    is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return int(isinstance(owner, _DEFS) and is_doc and isinstance(first.value.value, str))


def _show(node: ast.AST, limit: int = 60) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _at(node: ast.AST) -> str:
    return f" on line {node.lineno}"


def _stmt_sites(root: ast.AST, types: tuple[type, ...]) -> list[tuple[list, int]]:
    return [
        (body, i)
        for _, body, start in _bodies(root)
        if len(body) >= 2
        for i in range(start, len(body))
        if isinstance(body[i], types)
    ]


def _remove(what: str) -> Callable[[tuple[list, int], random.Random], str]:
    def apply(site: tuple[list, int], rng: random.Random) -> str:
        body, i = site
        stmt = body.pop(i)
        return f"Removed the {what} `{_show(stmt)}`{_at(stmt)}."

    return apply


def _methods(cls: ast.ClassDef) -> list[int]:
    return [i for i, s in enumerate(cls.body) if isinstance(s, _FUNCS)]


# ---- modifiers: (site finder, applier); an applier returns an explanation, or None for no change


def _invert(node: ast.If, rng) -> str:
    test = node.test
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    node.test = test.operand if negated else ast.UnaryOp(ast.Not(), test)
    node.body, node.orelse = node.orelse, node.body
    return f"Negated the condition `{_show(test)}`{_at(node)} and swapped its if and else branches."


def _operator_sites(root):
    sites: list[tuple[ast.AST, int | None]] = []
    for n in _walk(root):
        if isinstance(n, ast.BinOp | ast.AugAssign | ast.BoolOp) and type(n.op) in _FAMILY:
            sites.append((n, None))
        elif isinstance(n, ast.Compare):
            sites.extend((n, i) for i, op in enumerate(n.ops) if type(op) in _FAMILY)
    return sites


def _change_operator(site, rng) -> str:
    node, i = site
    old = type(node.op if i is None else node.ops[i])
    new = rng.choice([op for op in _FAMILY[old] if op is not old])
    if i is None:
        node.op = new()
    else:
        node.ops[i] = new()
    return f"Changed the operator `{_SYMBOL[old]}` to `{_SYMBOL[new]}`{_at(node)}."


def _swap_sites(root):
    return [
        n
        for n in _walk(root)
        if (isinstance(n, ast.BinOp) and isinstance(n.op, _NON_COMMUTATIVE))
        or (isinstance(n, ast.Compare) and len(n.ops) == 1 and not isinstance(n.ops[0], _SYMMETRIC_COMPARE))
    ]


def _swap(node, rng) -> str:
    before = _show(node)
    if isinstance(node, ast.BinOp):
        node.left, node.right = node.right, node.left
    else:
        node.left, node.comparators[0] = node.comparators[0], node.left
    return f"Swapped the operands of `{before}`{_at(node)}."


def _chain_sites(root):
    return [
        n
        for n in _walk(root)
        if (isinstance(n, ast.BinOp) and (isinstance(n.left, ast.BinOp) or isinstance(n.right, ast.BinOp)))
        or (isinstance(n, ast.BoolOp) and len(n.values) >= 3)
    ]


def _break_chain(node, rng) -> str:
    before = _show(node)
    if isinstance(node, ast.BoolOp):
        del node.values[rng.randrange(len(node.values))]
    else:
        options = [
            (side, keep)
            for side in ("left", "right")
            if isinstance(getattr(node, side), ast.BinOp)
            for keep in ("left", "right")
        ]
        side, keep = rng.choice(options)
        setattr(node, side, getattr(getattr(node, side), keep))
    return f"Dropped an operand from `{before}`{_at(node)}, leaving `{_show(node)}`."


def _change_constant(node: ast.Constant, rng) -> str:
    old = node.value
    node.value = old + rng.choice((1, -1))
    return f"Changed the constant `{old!r}` to `{node.value!r}`{_at(node)}."


def _wrapper_sites(root):
    types = (*_TRY, ast.With, ast.AsyncWith)
    return [
        (body, i)
        for _, body, start in _bodies(root)
        for i in range(start, len(body))
        if isinstance(body[i], types)
    ]


def _remove_wrapper(site, rng) -> str:
    body, i = site
    stmt = body[i]
    body[i : i + 1] = stmt.body
    what = "try statement" if isinstance(stmt, _TRY) else f"`with {_show(stmt.items[0])}` block"
    return f"Replaced the {what}{_at(stmt)} by its body."


def _shuffle_statements(site, rng) -> str | None:
    body, start = site
    part = body[start:]
    rng.shuffle(part)
    if all(a is b for a, b in zip(part, body[start:], strict=True)):
        return None
    first = body[start]
    body[start:] = part
    return f"Shuffled the order of the {len(part)} statements starting{_at(first)}."


def _remove_base(site, rng) -> str:
    cls, i = site
    base = cls.bases.pop(i)
    return f"Removed the base class `{_show(base)}` of `{cls.name}`."


def _remove_method(site, rng) -> str:
    cls, i = site
    method = cls.body.pop(i)
    return f"Removed the method `{method.name}` of `{cls.name}`."


def _shuffle_methods(cls: ast.ClassDef, rng) -> str | None:
    slots = _methods(cls)
    methods = [cls.body[i] for i in slots]
    order = methods[:]
    rng.shuffle(order)
    if all(a is b for a, b in zip(order, methods, strict=True)):
        return None
    for i, method in zip(slots, order, strict=True):
        cls.body[i] = method
    return f"Reordered the methods of `{cls.name}` to {', '.join(m.name for m in order)}."


_MODIFIER_FUNCS: dict[str, tuple[Callable[[Any], list], Callable[[Any, random.Random], str | None]]] = {
    "invert_if_else": (lambda r: [n for n in _walk(r) if isinstance(n, ast.If) and n.orelse], _invert),
    "change_operator": (_operator_sites, _change_operator),
    "swap_operands": (_swap_sites, _swap),
    "break_chains": (_chain_sites, _break_chain),
    "change_constant": (
        lambda r: [n for n in _walk(r) if isinstance(n, ast.Constant) and type(n.value) in (int, float)],
        _change_constant,
    ),
    "remove_assignment": (
        lambda r: _stmt_sites(r, (ast.Assign, ast.AugAssign, ast.AnnAssign)),
        _remove("assignment"),
    ),
    "remove_conditional": (lambda r: _stmt_sites(r, (ast.If,)), _remove("conditional")),
    "remove_loop": (lambda r: _stmt_sites(r, (ast.For, ast.AsyncFor, ast.While)), _remove("loop")),
    "remove_wrapper": (_wrapper_sites, _remove_wrapper),
    "shuffle_statements": (
        lambda r: [(body, start) for _, body, start in _bodies(r) if len(body) - start >= 3],
        _shuffle_statements,
    ),
    "remove_base_class": (lambda r: [(r, i) for i in range(len(r.bases))], _remove_base),
    "remove_methods": (
        lambda r: [(r, i) for i in _methods(r)] if len(_methods(r)) >= 2 else [],
        _remove_method,
    ),
    "shuffle_methods": (lambda r: [r] if len(_methods(r)) >= 2 else [], _shuffle_methods),
}
