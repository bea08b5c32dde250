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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import SmithError
from ..schema import default
from .candidates import Candidate, make_candidate, shard_of
from .gitrepo import file_patch, is_test_path
from .procedural_modifiers import _DEFS, _MODIFIER_FUNCS

log = logging.getLogger("sweflow.smith.procedural")

MODIFIERS: tuple[str, ...] = (
    "invert_if_else", "change_operator", "swap_operands", "break_chains", "change_constant",
    "remove_assignment", "remove_conditional", "remove_loop", "remove_wrapper", "shuffle_statements",
    "remove_base_class", "remove_methods", "shuffle_methods",
)  # fmt: skip
_CLASS_MODIFIERS = frozenset({"remove_base_class", "remove_methods", "shuffle_methods"})
_BRANCHES = (
    ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.ExceptHandler, ast.IfExp,
    ast.comprehension, ast.match_case,
)  # fmt: skip
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
    source: str,
    *,
    min_complexity: int = default("smith.strategies.procedural.min_complexity"),
    min_class_complexity: int = 10,
) -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of the functions, methods and classes complex enough to mutate, in source order."""
    found = _all_entities(ast.parse(source))
    return [(name, node) for name, node in found if _keep(node, min_complexity, min_class_complexity)]


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
    per_entity: int = default("smith.strategies.procedural.per_entity"),
    min_complexity: int = default("smith.strategies.procedural.min_complexity"),
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
    shards: int = default("smith.strategies.procedural.shards"),
    modifiers: Iterable[str] | None = None,
    per_entity: int = default("smith.strategies.procedural.per_entity"),
    min_complexity: int = default("smith.strategies.procedural.min_complexity"),
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
