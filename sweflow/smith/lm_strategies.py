"""LM bug strategies (SWE-smith): `lm_modify` asks the LM to rewrite one function with a subtle bug;
`lm_rewrite` stubs a function's body (signature and docstring kept) and asks the LM to implement it again
from the signature, docstring and the rest of the file, keeping whatever it gets wrong.

Only the function's lines change; a reply that does not fit becomes a `{"entity", "reason"}` record.
"""

from __future__ import annotations

import ast
import io
import os
import random
import textwrap
import tokenize
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import SmithError
from ..schema import default
from .candidates import Candidate, dedupe, make_candidate, shard_of
from .gitrepo import file_patch, is_test_path
from .lm import LMSettings, code_block, complete
from .statements import prompt_sha256, render_prompt

LM_STRATEGIES = ("lm_modify", "lm_rewrite")
LM_SYSTEM = "You are an expert Python developer. Follow the instructions exactly and reply only as asked."
_MAX_CONTEXT_CHARS = 20000
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


class _Skip(Exception):
    """One entity gives no candidate; the message is the record's reason."""


def _span(node: ast.AST) -> tuple[int, int]:
    """First line (decorators included) and last line of a definition, 1-based."""
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return start, node.end_lineno


def _multiline_string_lines(code: str) -> set[int]:
    """1-based numbers of the lines that continue a multi-line token (inside triple-quoted strings)."""
    inner: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.end[0] > tok.start[0]:
            inner.update(range(tok.start[0] + 1, tok.end[0] + 1))
    return inner


def _dedent(lines: list[str], indent: str) -> str:
    return "".join(ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines)


def _reindent(code: str, indent: str) -> str:
    """`indent` before every non-empty line of `code` except continuation lines of multi-line strings."""
    if not indent:
        return code
    inner = _multiline_string_lines(code)
    lines = code.splitlines(keepends=True)
    return "".join(ln if n in inner or not ln.strip() else indent + ln for n, ln in enumerate(lines, 1))


def _function_from_reply(reply: str, name: str) -> str:
    block = code_block(reply)
    if block is None:
        raise _Skip("no python code block in the reply")
    code = textwrap.dedent(block).strip("\n") + "\n"
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise _Skip(f"the reply does not parse: {exc.msg} (line {exc.lineno})") from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], _DEFS):
        raise _Skip("the reply is not exactly one function definition")
    if tree.body[0].name != name:
        raise _Skip(f"the reply defines {tree.body[0].name!r}, not {name!r}")
    return code


def _stub(lines: list[str], node: ast.AST, indent: str) -> str:
    """The function (dedented) with its body replaced by `raise NotImplementedError` (docstring kept)."""
    start, end = _span(node)
    body = node.body
    has_doc = (
        isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    first = body[0]
    if first.lineno == node.lineno:
        raise _Skip("the body is on the line of the signature")
    keep_to = body[0].end_lineno if has_doc else first.lineno - 1
    if has_doc and len(body) == 1:
        raise _Skip("the function has no body besides its docstring")
    body_indent = lines[first.lineno - 1][: first.col_offset]
    kept = lines[start - 1 : keep_to]
    if kept and not kept[-1].endswith("\n"):
        kept[-1] += "\n"
    return _dedent(kept, indent) + body_indent[len(indent) :] + "raise NotImplementedError\n"


# Entities are sampled with the seed, so the output is the same for a seed given a deterministic endpoint.
def _sample(items: list, seed: int, limit: int | None) -> list:
    if limit is None or len(items) <= limit:
        return items
    picked = sorted(random.Random(seed).sample(range(len(items)), max(limit, 0)))
    return [items[i] for i in picked]


def _entities(source: str, min_complexity: int) -> list[tuple[str, ast.AST]]:
    from .procedural import entities

    return [
        (n, node) for n, node in entities(source, min_complexity=min_complexity) if isinstance(node, _DEFS)
    ]


# The LM's function replaces the original's lines (decorators included) at the same indentation; every other
# line of the file stays byte-identical. A failed request, a reply without a code block, a reply that is not
# exactly one function of the same name, a file that no longer parses, or no change at all is not fatal: it
# becomes a `{"entity", "reason"}` record.
def _one(
    strategy: str,
    path: str,
    text: str,
    qualname: str,
    node: ast.AST,
    settings: LMSettings,
) -> tuple[str, str]:
    """(new file text, explanation) for one entity, or _Skip."""
    lines = text.splitlines(keepends=True)
    start, end = _span(node)
    indent = lines[node.lineno - 1][: node.col_offset]
    if indent.strip():
        raise _Skip("the definition does not start its line")
    tail = lines[end - 1].encode("utf-8")[node.end_col_offset :].decode("utf-8")
    if tail.strip() and not tail.strip().startswith("#"):
        raise _Skip("code follows the definition on its last line")
    name = qualname.rsplit(".", 1)[-1]
    original = _dedent(lines[start - 1 : end], indent)
    if strategy == "lm_modify":
        user = render_prompt("lm_modify", path=path, name=qualname, function=original.rstrip("\n"))
        explanation = f"LM rewrite of {qualname} with a bug"
    else:
        stub = _stub(lines, node, indent)
        stubbed_file = "".join(lines[: start - 1]) + _reindent(stub, indent) + "".join(lines[end:])
        context = (
            stubbed_file if len(stubbed_file) <= _MAX_CONTEXT_CHARS else stubbed_file[:_MAX_CONTEXT_CHARS]
        )
        user = render_prompt(
            "lm_rewrite", path=path, name=qualname, stub=stub.rstrip("\n"), context=context.rstrip("\n")
        )
        explanation = f"LM re-implementation of {qualname} from its signature and docstring"
    try:
        reply = complete(settings, LM_SYSTEM, user)
    except SmithError as exc:
        raise _Skip(f"request failed: {exc}") from None
    code = _function_from_reply(reply, name)
    try:
        new_function = _reindent(code, indent)
    except (tokenize.TokenError, SyntaxError):
        raise _Skip("the reply cannot be re-indented") from None
    if end == len(lines) and not lines[-1].endswith("\n"):
        new_function = new_function.removesuffix("\n")  # the file ended without a newline; keep it so
    new_text = "".join(lines[: start - 1]) + new_function + "".join(lines[end:])
    if new_text == text:
        raise _Skip("no change")
    try:
        ast.parse(new_text)
    except SyntaxError as exc:
        raise _Skip(f"the file does not parse with the reply spliced in: {exc.msg}") from None
    return new_text, explanation


def lm_candidates(
    tree: str | os.PathLike,
    files: Iterable[str],
    *,
    repo: str,
    commit: str,
    strategy: str,
    settings: LMSettings,
    seed: int,
    shard: int = 0,
    shards: int = default("smith.strategies.lm_modify.shards"),
    max_candidates: int | None = None,
    min_complexity: int = default("smith.strategies.procedural.min_complexity"),
) -> tuple[list[Candidate], list[dict[str, Any]]]:
    """Candidates of one LM strategy for this shard's function entities in the non-test `files` of
    `tree`, and a `{"entity", "reason"}` record for every entity (or file) that gave none."""
    if strategy not in LM_STRATEGIES:
        raise SmithError(
            f"unknown LM strategy {strategy!r}", field="strategy", hint=f"one of {LM_STRATEGIES}"
        )
    if not 0 <= shard < shards:
        raise SmithError(f"shard {shard} is not in [0, {shards})", field="shard")
    if max_candidates is not None and max_candidates < 0:
        raise SmithError("max_candidates must not be negative", field="max_candidates")
    root = Path(tree)
    failures: list[dict[str, Any]] = []
    sources: dict[str, str] = {}
    found: list[tuple[str, str, ast.AST]] = []
    for path in files:
        if is_test_path(path) or not path.endswith(".py"):
            continue
        try:
            text = (root / path).read_text(encoding="utf-8")
            ents = _entities(text, min_complexity)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
            failures.append({"entity": path, "reason": f"cannot read or parse: {type(exc).__name__}"})
            continue
        sources[path] = text
        found += [(path, q, n) for q, n in ents if shard_of(f"{path}::{q}", shards) == shard]
    prompt = prompt_sha256(strategy)
    cands: list[Candidate] = []
    for path, qualname, node in _sample(found, seed, max_candidates):
        entity = f"{path}::{qualname}"
        try:
            new_text, explanation = _one(strategy, path, sources[path], qualname, node, settings)
        except _Skip as exc:
            failures.append({"entity": entity, "reason": str(exc)})
            continue
        patch = file_patch(path, sources[path], new_text)
        cands.append(
            make_candidate(
                repo,
                commit,
                strategy,
                patch,
                [path],
                entity=entity,
                explanation=explanation,
                model=settings.model,
                prompt_sha256=prompt,
            )
        )
    return dedupe(cands), failures
