"""Canary placing: the test files as the run will find them, each canary put into its file, the shell lines.

Each clone sits after a sibling drawn at random (a function among the module's definitions, a method among
its class's, sharing the class's fixtures and setUp); the file is written whole. ``test_patch_of`` and
``apply_to`` give a file's text after the eval script's test patch, applied by the host's git (no repository).
"""

from __future__ import annotations

import ast
import base64
import random
import re
import secrets
import shlex
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from .canary import F2P, MUST_FAIL, Canary, CanarySet
from .canary_plan import _once, _plain_tests, first_line

# the eval scripts' test-patch heredoc: git apply ... <<'EOF_114329324912' ... EOF_114329324912
_APPLY_HEREDOC = re.compile(r"^\s*git apply\b.*<<\s*'?([A-Za-z_][A-Za-z0-9_]*)'?\s*$")


def test_patch_of(script: str) -> str:
    """The test patch an eval script applies (its ``git apply ... <<'EOF_x'`` heredoc), or ''."""
    lines = script.split("\n")
    for i, line in enumerate(lines):
        m = _APPLY_HEREDOC.match(line)
        if m:
            end = next((j for j in range(i + 1, len(lines)) if lines[j] == m.group(1)), None)
            if end is not None:
                return "\n".join(lines[i + 1 : end]) + "\n"
    return ""


def apply_to(path: str, base: str | None, patch: str) -> str | None:
    """``path``'s text after the test patch (applied by the host's git, outside any repository), or None."""
    if not patch.strip() or f"b/{path}" not in patch:
        return base
    with tempfile.TemporaryDirectory(prefix="sweflow-canary-") as tmp:
        target = Path(tmp) / path
        if base is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(base, encoding="utf-8", errors="surrogateescape")
        r = subprocess.run(
            ["git", "apply", "--whitespace=nowarn", f"--include={path}", "-"],
            cwd=tmp,
            input=patch.encode("utf-8", "surrogateescape"),
            capture_output=True,
            timeout=60,
        )
        if r.returncode != 0 or not target.exists():
            return None
        return target.read_text(encoding="utf-8", errors="surrogateescape")


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _gap(lines: list[str], lineno: int) -> int:
    """Blank lines right above line ``lineno`` (1-based): how the file spaces a definition."""
    n, i = 0, lineno - 2
    while i >= 0 and not lines[i].strip():
        n, i = n + 1, i - 1
    return n


def place(
    canaries: Sequence[Canary], current: Mapping[str, str | None], rng: random.Random | None = None
) -> CanarySet:
    """Where each canary goes in its file as the run will find it (``current``: path -> that text).

    Each goes after a definition drawn at random among its siblings (a module-level function or class
    for a function, a method of its own class for a method), never always last, so its place in the file
    or in the run's order tells nothing; a FAIL_TO_PASS test's twins go right before and after it, the
    test's place among them drawn uniformly, spaced as the file spaces it (a decoy run's stand-in takes
    the test's own lines); the whole new text of the file is written. A canary whose file
    is gone or does not parse, whose class is gone or defined twice, or whose class is indented otherwise
    than its clone is dropped; no must-fail canary left, none at all."""
    rng = rng or random.SystemRandom()
    kept: list[Canary] = []
    writes: dict[str, str] = {}
    for path in sorted({c.path for c in canaries}):
        text = current.get(path)
        group = [c for c in canaries if c.path == path]
        try:
            tree = ast.parse(text or "")
        except (SyntaxError, ValueError):
            continue
        if text is None:
            continue
        scopes = _once(tree.body)
        lines = text.split("\n")
        inserts: dict[int, list[str]] = {}
        replaced: dict[int, tuple[int, list[str]]] = {}  # first line -> (last line, new lines)
        placed = []
        defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

        twins: dict[tuple[str, str], list[Canary]] = {}
        for c in group:
            scope = tree
            if c.cls:
                node = scopes.get(c.cls)
                if not isinstance(node, ast.ClassDef) or not node.body:
                    continue
                first = lines[node.body[0].lineno - 1]
                if _indent(first) != _indent(c.source.split("\n", 1)[0]) or not _indent(first):
                    continue
                scope = node
            if c.of == F2P:  # beside the test it is a twin of, in a random order with it
                twins.setdefault((c.cls, c.cloned_from), []).append(c)
                continue
            if c.cls:
                after = [n.end_lineno for n in scope.body if isinstance(n, defs)] or [scope.end_lineno]
                block = ["", c.source.rstrip("\n")]
            else:
                after = [n.end_lineno for n in tree.body if isinstance(n, defs)] or [len(lines)]
                block = ["", "", c.source.rstrip("\n")]
            inserts.setdefault(rng.choice(after), []).extend(block)
            placed.append(c)
        for (cls, name), cs in sorted(twins.items()):
            scope = scopes.get(cls) if cls else tree
            node = _once(scope.body).get(name) if scope is not None else None
            if not isinstance(node, ast.FunctionDef):
                continue
            top = first_line(node)
            blank = [""] * (_gap(lines, top) or (1 if cls else 2))
            stand_in = [c for c in cs if c.replaces]
            others = [c for c in cs if not c.replaces]
            rng.shuffle(others)
            k = rng.randint(0, len(others))
            before = [ln for c in others[:k] for ln in [*c.source.rstrip("\n").split("\n"), *blank]]
            inserts.setdefault(top - 1, []).extend(before)
            inserts.setdefault(node.end_lineno, [])[:0] = [
                ln for c in others[k:] for ln in [*blank, *c.source.rstrip("\n").split("\n")]
            ]
            if stand_in:
                replaced[top] = (node.end_lineno, stand_in[0].source.rstrip("\n").split("\n"))
            placed.extend(stand_in[:1] + others)
        new_lines: list[str] = list(inserts.get(0, []))
        skip_to = 0
        for i, line in enumerate(lines, 1):
            if i in replaced:
                skip_to, repl = replaced[i]
                new_lines.extend(repl)
            if i > skip_to:
                new_lines.append(line)
            new_lines.extend(inserts.get(i, []))
        new = "\n".join(new_lines)
        try:
            defined = set(_plain_tests(ast.parse(new), docstrings=True, params=True))  # the plan chose
        except (SyntaxError, ValueError):
            continue
        if placed and all((c.cls, c.name) in defined for c in placed):
            writes[path] = new
            kept.extend(placed)
    if not any(c.expect == MUST_FAIL for c in kept):
        return CanarySet()
    order = {id(c): i for i, c in enumerate(canaries)}
    return CanarySet(tuple(sorted(kept, key=lambda c: order[id(c)])), writes)


def injection(canaries: Sequence[Canary] | CanarySet) -> str:
    """Shell lines planting the canaries: the new text of a file written whole (base64, so any byte goes
    through), or the module-level ones appended (one heredoc per file, a random delimiter)."""
    cset = canaries if isinstance(canaries, CanarySet) else CanarySet(tuple(canaries))
    out = []
    for path, text in cset.writes.items():
        b64 = base64.b64encode(text.encode("utf-8", "surrogateescape")).decode()
        out.append(f"printf %s {b64} | base64 -d > {shlex.quote(path)}")
    by_path: dict[str, list[Canary]] = {}
    for c in cset.canaries:
        if c.path not in cset.writes:
            by_path.setdefault(c.path, []).append(c)
    for path, group in by_path.items():
        delim = f"EOF_{secrets.randbelow(10**12):012d}"
        body = "\n\n\n".join(c.source.rstrip("\n") for c in group)
        out.append(f"cat >> {shlex.quote(path)} <<'{delim}'\n\n\n{body}\n{delim}")
    return "\n".join(out)


def inject(script: str, canaries: Sequence[Canary] | CanarySet, start_marker: str | None) -> str:
    """``script`` with the canaries planted in their files just before the start-of-test-output line."""
    if not canaries:
        return script
    lines = script.split("\n")
    at = [i for i, ln in enumerate(lines) if start_marker and start_marker in ln and "<<" not in ln]
    if not at:
        raise ValueError("the eval script has no start-of-test-output line to put canaries before")
    i = at[0]
    return "\n".join(lines[:i] + [injection(canaries)] + lines[i:])
