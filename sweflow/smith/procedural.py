"""Procedural bugs (SWE-smith style): small seeded AST modifications of one function or class at a time.

Only the stdlib `ast` module is used. The mutated entity is unparsed and spliced back in place of its own
lines (decorators included), re-indented to its column; every other line of the file stays byte-identical.
"""

from __future__ import annotations

import ast
import copy
import io
import logging
import os
import pickle
import random
import re
import tokenize
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SmithError
from .candidates import Candidate, make_candidate, shard_of
from .gitrepo import file_patch, is_test_path

log = logging.getLogger("sweflow.smith.procedural")

MODIFIERS: tuple[str, ...] = (
    "invert_if_else", "change_operator", "swap_operands", "break_chains", "change_constant",
    "remove_assignment", "remove_conditional", "remove_loop", "remove_wrapper", "shuffle_statements",
    "remove_base_class", "remove_methods", "shuffle_methods",
)  # fmt: skip
_CLASS_MODIFIERS = frozenset({"remove_base_class", "remove_methods", "shuffle_methods"})

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_DEFS = (*_FUNCS, ast.ClassDef)
_TRY = (ast.Try, getattr(ast, "TryStar", ast.Try))
_BRANCHES = (
    ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.ExceptHandler, ast.IfExp,
    ast.comprehension, ast.match_case,
)  # fmt: skip
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
_LINE_RE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


@dataclass(frozen=True)
class Mutation:
    """One modified version of a file: `source` is the whole new text; `explanation` is for metadata only."""

    entity: str
    kind: str
    modifier: str
    explanation: str
    source: str


# ---- entities and complexity


def _complexity(node: ast.AST) -> int:
    subs = list(ast.walk(node))
    bool_operands = sum(len(s.values) - 1 for s in subs if isinstance(s, ast.BoolOp))
    return 1 + bool_operands + sum(isinstance(s, _BRANCHES) for s in subs)


def _all_entities(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    out: list[tuple[str, ast.AST]] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, _DEFS):
                out.append((prefix + node.name, node))
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return out


def _keep(node: ast.AST, min_complexity: int, min_class_complexity: int) -> bool:
    limit = min_class_complexity if isinstance(node, ast.ClassDef) else min_complexity
    return _complexity(node) >= limit


def entities(
    source: str, *, min_complexity: int = 3, min_class_complexity: int = 10
) -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of the functions, methods and classes complex enough to mutate, in source order."""
    found = _all_entities(ast.parse(source))
    return [(name, node) for name, node in found if _keep(node, min_complexity, min_class_complexity)]


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


# ---- splicing


def _reindent(code: str, indent: str, newline: str) -> str | None:
    """Prefix `indent` to every non-empty line of `code` except lines inside multi-line strings."""
    inner: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.end[0] > tok.start[0]:
                inner.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        return None
    lines = code.split("\n")
    return newline.join(ln if n in inner or not ln else indent + ln for n, ln in enumerate(lines, 1))


def _string_quotes(code: str) -> list[tokenize.TokenInfo]:
    try:
        return [t for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type == tokenize.STRING]
    except (tokenize.TokenError, SyntaxError):
        return []


def _quotes_like(code: str, original: str) -> str:
    """`code` (unparsed, which writes '...') with its plain single-quoted strings written "..." when the
    original entity mostly uses double quotes: the bugged function must not stand out by its quoting."""
    quotes = [t.string.lstrip("rRbBuUfF")[:1] for t in _string_quotes(original)]
    if quotes.count('"') <= quotes.count("'"):
        return code
    lines = code.split("\n")
    for tok in reversed(_string_quotes(code)):
        prefix = tok.string[: len(tok.string) - len(tok.string.lstrip("rRbBuUfF"))]
        text = tok.string[len(prefix) :]
        if tok.start[0] != tok.end[0] or not text.startswith("'") or text.startswith("'''"):
            continue
        inner = text[1:-1]
        if '"' in inner or "\\" in inner:
            continue
        row, col = tok.start[0] - 1, tok.start[1]
        line = lines[row]
        lines[row] = line[:col] + prefix + '"' + inner + '"' + line[tok.end[1] :]
    return "\n".join(lines)


def _splice(lines: list[str], node: ast.AST, code: str) -> str | None:
    """The file text with `node`'s lines replaced by `code` (unparsed); None when the layout is odd."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    indent = lines[node.lineno - 1][: node.col_offset]
    last = lines[node.end_lineno - 1]
    tail = last.encode("utf-8")[node.end_col_offset :].decode("utf-8")
    if indent.strip() or (tail.strip() and not tail.strip().startswith("#")):
        return None
    newline = last[len(last.rstrip("\r\n")) :] or "\n"
    text = _reindent(code, indent, newline)
    if text is None:
        return None
    return "".join(lines[: start - 1]) + text + tail + "".join(lines[node.end_lineno :])


def _copy(node: ast.AST, modifier: str) -> ast.AST:
    """A copy to mutate: deep (a pickle round trip, twice as fast as copy.deepcopy) for function modifiers;
    class modifiers only edit the class's own `bases` and `body` lists."""
    if modifier not in _CLASS_MODIFIERS:
        return pickle.loads(pickle.dumps(node, pickle.HIGHEST_PROTOCOL))
    work = copy.copy(node)
    work.bases, work.body = list(node.bases), list(node.body)
    return work


def _selected(modifiers: Iterable[str] | None) -> list[str]:
    if modifiers is None:
        return list(MODIFIERS)
    wanted = set(modifiers)
    unknown = sorted(wanted - set(MODIFIERS))
    if unknown:
        raise SmithError(
            f"unknown procedural modifiers {unknown}", field="modifiers", hint=f"one of {MODIFIERS}"
        )
    return [m for m in MODIFIERS if m in wanted]


def _mutate(
    source: str,
    tree: ast.Module,
    found: list[tuple[str, ast.AST]],
    *,
    seed: int,
    modifiers: list[str],
    per_entity: int,
) -> list[Mutation]:
    lines = _LINE_RE.findall(source)
    out: list[Mutation] = []
    for name, node in found:
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        before = ast.unparse(node)
        segment = "".join(lines[node.lineno - 1 : node.end_lineno])
        for modifier in modifiers:
            if (modifier in _CLASS_MODIFIERS) != (kind == "class"):
                continue
            find, apply = _MODIFIER_FUNCS[modifier]
            rng = random.Random(f"{seed}:{name}:{modifier}")
            order = list(range(len(find(node))))
            rng.shuffle(order)
            seen: set[str] = set()
            for index in order:
                if len(seen) >= per_entity:
                    break
                work = _copy(node, modifier)
                explanation = apply(find(work)[index], rng)
                code = None if explanation is None else ast.unparse(work)
                new = None if code in (None, before) else _splice(lines, node, _quotes_like(code, segment))
                if new is None or new in seen:
                    continue
                try:
                    ast.parse(new)
                except SyntaxError:
                    continue
                seen.add(new)
                out.append(Mutation(name, kind, modifier, explanation, new))
    return out


def mutate_source(
    source: str,
    *,
    seed: int,
    modifiers: Iterable[str] | None = None,
    per_entity: int = 1,
    min_complexity: int = 3,
    min_class_complexity: int = 10,
) -> list[Mutation]:
    """Up to `per_entity` distinct seeded mutations per entity and applicable modifier, in source order."""
    tree = ast.parse(source)
    found = [(n, e) for n, e in _all_entities(tree) if _keep(e, min_complexity, min_class_complexity)]
    return _mutate(source, tree, found, seed=seed, modifiers=_selected(modifiers), per_entity=per_entity)


def procedural_candidates(
    tree: str | os.PathLike,
    files: Iterable[str],
    *,
    repo: str,
    commit: str,
    seed: int,
    shard: int = 0,
    shards: int = 1,
    modifiers: Iterable[str] | None = None,
    per_entity: int = 1,
    min_complexity: int = 3,
    min_class_complexity: int = 10,
    max_candidates: int | None = None,
) -> list[Candidate]:
    """Procedural candidates for the non-test `files` of the checkout `tree`, for the entities in `shard`."""
    if not 0 <= shard < shards:
        raise SmithError(f"shard {shard} is not in [0, {shards})", field="shard")
    chosen = _selected(modifiers)
    out: list[Candidate] = []
    seen: set[str] = set()
    for file in dict.fromkeys(files):
        if is_test_path(file):
            continue
        try:
            with open(Path(tree) / file, encoding="utf-8", newline="") as fh:
                old = fh.read()
            parsed = ast.parse(old)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
            log.warning("procedural: skipping %s: %s", file, exc)
            continue
        found = [
            (name, node)
            for name, node in _all_entities(parsed)
            if _keep(node, min_complexity, min_class_complexity)
            and shard_of(f"{file}::{name}", shards) == shard
        ]
        for m in _mutate(old, parsed, found, seed=seed, modifiers=chosen, per_entity=per_entity):
            patch = file_patch(file, old, m.source)
            if not patch or patch in seen:
                continue
            seen.add(patch)
            meta = {"entity": f"{file}::{m.entity}", "modifier": m.modifier, "explanation": m.explanation}
            out.append(
                make_candidate(repo, commit, "procedural", patch, [file], **meta, kind=m.kind, seed=seed)
            )
    if max_candidates is not None and len(out) > max_candidates:
        rng = random.Random(f"{seed}:{shard}/{shards}:sample")
        out = [out[i] for i in sorted(rng.sample(range(len(out)), max_candidates))]
    return out
