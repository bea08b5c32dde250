"""Canary tests: the host's own tests, added to every fresh evaluation, whose outcome the host knows.

The code under test owns the test runner's process (the tests import it), so it can make every test
"pass" (``pytest.Function.runtest = lambda self: None``), print ``PASSED <id>`` for every collected test
and exit, or no-op only the tests it guesses are FAIL_TO_PASS (new in the file, failing without a fix).
No text rule keeps up with that. Canaries turn the question around: after the test patch is applied and
before the test command, the host appends a few tests of its own to a test file the command runs, and
knows what each must report:

- **must fail**: a clone of a PASS_TO_PASS test of that file whose last top-level equality check
  (``assert a == b``, or ``self.assertEqual(a, b)`` in a test class) expects another constant; where no
  constant can change, the opposite check (``!=``, ``assertNotEqual``), which is only sound while the
  tested code is the base's;
- **must fail, twin of a FAIL_TO_PASS test**: the same with another constant (never the opposite): it
  fails without a fix (where its original does) and with a correct fix (whose value is the original's);
- **must pass**: a verbatim clone of a PASS_TO_PASS test.

Each clone keeps its original's formatting and gets a name built from its siblings' names, drawn at
random per evaluation (``random.SystemRandom``), and sits after a sibling drawn at random (a function
among the module's definitions, a method among its class's, sharing the class's fixtures and setUp); the
file is written whole, as the run will find it. To a forger it is one more new test that fails without a
fix, like the FAIL_TO_PASS tests, and the FAIL_TO_PASS tests have near-twins as the cloned tests do: a
forger that tells clones by their twin in the committed file or in the file as run (constants and
``==``/``!=`` masked) and passes every other new test is caught by, or not paid past, the FAIL_TO_PASS
twins
(``tests/integration/test_attacks_runner.py``). What remains to such a forger is a guess, per
FAIL_TO_PASS test that has twins, of which of the look-alike new tests is the original.

Forging canaries "passing" is caught; leaving them alone leaves the real FAIL_TO_PASS tests failing. A
canary with the wrong status, or missing from the log, is ``runner_tampered`` (reward 0); so is a test
exit status of 0 while a must-fail canary ran. A run that fails its grade anyway keeps the grade's reason
unless a must-fail canary was reported passing (no honest run does that; an honest run that breaks
collection leaves canaries absent and stays e.g. fail_to_pass_failure). Canaries never enter F2P/P2P
counts or the status maps kept as evidence.

Which runners carry them (``family_of`` the row's harness parser), on tests without arguments (``self``
aside), decorators or docstrings, defined once:
- **pytest** (``parse_log_pytest*``, matplotlib's and seaborn's parsers, pytest's verbose lines): module
  functions ``path::test_x`` and methods ``path::Class::test_x`` (plain or ``unittest.TestCase``);
- **Django** (``parse_log_django``, unittest's verbose lines): methods ``test_x (module.Class)``, in
  ``tests/<module>.py``, either form of the id unittest prints (``(module.Class.test_x)`` since 3.11);
- **sympy** (``parse_log_sympy``, bin/test's ``test_x ok`` lines): module functions of the files the
  command names, names kept clear of every test name of the row (the ids carry no file).
Rows of other parsers (the JavaScript, Go, Rust, Java families of 5.x) and tests with no clonable check
(parametrized only, data-driven cases such as mypy's ``.test`` files) get none; they are guarded by the
exit-status, contradiction and duplicate checks of the grade, and the evaluation records ``canaries: []``.

``runner_finished`` is the second check here: a pytest run that passes must end with pytest's own closing
summary (``=== N passed ... in 1.2s ===``) inside the test section, and the summary's passed count must
equal the number of distinct PASSED lines of the log (a forger printing ``PASSED`` lines and exiting
leaves no summary, or one that does not add up).
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RUNNER_TAMPERED = "runner_tampered"
RUNNER_NOT_FINISHED = "runner_not_finished"
MUST_FAIL, MUST_PASS = "fail", "pass"
PYTEST, DJANGO, SYMPY = "pytest", "django", "sympy"
P2P, F2P = "p2p", "f2p"  # what a canary is cloned from
FAIL_STATUSES = ("FAILED", "ERROR")
# the eval scripts' test-patch heredoc: git apply ... <<'EOF_114329324912' ... EOF_114329324912
_APPLY_HEREDOC = re.compile(r"^\s*git apply\b.*<<\s*'?([A-Za-z_][A-Za-z0-9_]*)'?\s*$")
# pytest's closing line, bordered by "=" (plain, -v) or bare (-q): "1 failed, 2 passed, 1 warning in 0.03s"
_SUMMARY = re.compile(r"^=* ?(?P<body>(?:\d+ [a-z]+(?:, )?)+|no tests ran) in [\d.]+s(?: \([^)]*\))? ?=*\s*$")
# pytest-sugar's and pytest-pretty's closing block: "Results (0.77s):" then "   169 passed" lines
_RESULTS_BLOCK = re.compile(r"^Results \([\d.]+s\):\s*$")
_RESULTS_LINE = re.compile(r"^\s+(\d+ [a-z]+)\s*$")
_SUMMARY_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)")
_RA_PASSED = re.compile(r"^PASSED (\S.*?)\s*$")
_VERBOSE_PASSED = re.compile(r"^(\S+?::.+?) PASSED(?: +\[ *\d+%\])?\s*$")


@dataclass(frozen=True)
class Canary:
    """One host test: ``name`` (in class ``cls`` of ``path`` when set), whether it must ``fail`` or
    ``pass``, its source, and the runner ``family`` whose parser reports it (``module``: the dotted module
    Django's runner names it by)."""

    path: str
    name: str
    expect: str
    source: str
    cloned_from: str
    cls: str = ""
    family: str = PYTEST
    module: str = ""
    of: str = P2P

    @property
    def ids(self) -> tuple[str, ...]:
        """The keys the family's parser may report this test under (first: the one it prints today)."""
        if self.family == DJANGO:
            # unittest's description: "name (module.Class)", since Python 3.11 "name (module.Class.name)";
            # the parser also keys a "FAIL: name (...)" line by the bare name
            return (
                f"{self.name} ({self.module}.{self.cls})",
                f"{self.name} ({self.module}.{self.cls}.{self.name})",
                self.name,
            )
        if self.family == SYMPY:  # a failure's header also names it: "____ path.py:name ____"
            return (self.name, f"{self.path}:{self.name}")
        return ("::".join([self.path, *([self.cls] if self.cls else []), self.name]),)

    @property
    def test_id(self) -> str:
        return self.ids[0]

    def status_in(self, statuses: Mapping[str, str]) -> str | None:
        return next((statuses[i] for i in self.ids if i in statuses), None)

    def to_dict(self) -> dict[str, str]:
        d = asdict(self)
        d.pop("source")
        return d


@dataclass(frozen=True)
class CanarySet:
    """Canaries as planted: the tests, and the whole new text of each file that gets a test inside one of
    its classes (the rest are appended to their files)."""

    canaries: tuple[Canary, ...] = ()
    writes: Mapping[str, str] = field(default_factory=dict)

    def __iter__(self):
        return iter(self.canaries)

    def __len__(self) -> int:
        return len(self.canaries)

    def __bool__(self) -> bool:
        return bool(self.canaries)


def family_of(parser) -> str | None:
    """The runner family a harness parser reads (``pytest``, ``django``, ``sympy``), or None: no canaries."""
    name = getattr(parser, "__name__", "")
    if "pytest" in name or name in ("parse_log_matplotlib", "parse_log_seaborn"):
        return PYTEST
    return {"parse_log_django": DJANGO, "parse_log_sympy": SYMPY}.get(name)


def is_pytest_parser(parser) -> bool:
    """Whether ``parser`` reads pytest's output (the family the closing-summary check covers)."""
    return family_of(parser) == PYTEST


# ----- planning -----------------------------------------------------------------------------------------
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


def _plain(fn, method: bool) -> bool:
    """``def test_x():`` (``def test_x(self):`` in a class): no other arguments, no decorators."""
    a = getattr(fn, "args", None)
    if (
        not isinstance(fn, ast.FunctionDef)
        or fn.decorator_list
        or a is None
        or not fn.name.startswith("test")
    ):
        return False
    if a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults:
        return False
    return [x.arg for x in a.args] == (["self"] if method else [])


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


def _mutated_constant(value, rng: random.Random, far: bool = False):
    """Another constant of the same type; ``far``: not one an off-by-one bug would produce."""
    if isinstance(value, bool) or value is None:
        return None
    # the sign stays: a literal is never negative (``-1`` is a unary minus on ``1``), so a clone whose
    # constant turned negative would differ from its original in shape, not just in value
    if isinstance(value, int):
        steps = [-97, -40, 31, 64, 89, 1000] if far else [-3, -2, -1, 1, 2, 3, 7, 10]
        return value + rng.choice([d for d in steps if value + d >= 0])
    if isinstance(value, float):
        return value + rng.choice([1.0, 2.5, 0.5]) * (abs(value) or 1.0)
    if isinstance(value, str):
        letters = "abcdefghijklmnopqrstuvwxyz"
        i = rng.randint(0, len(value))
        return value[:i] + rng.choice(letters) + value[i:]
    return None


def _constant_edit(node: ast.expr, text: str, lines: list[str], rng: random.Random, far: bool):
    """(start, end, replacement) writing another constant in place of ``node``, or None."""
    if not isinstance(node, ast.Constant):
        return None
    new = _mutated_constant(node.value, rng, far=far)
    s = _offset(lines, node.lineno, node.col_offset)
    e = _offset(lines, node.end_lineno, node.end_col_offset)
    seg = text[s:e]
    if new is not None and isinstance(new, str):
        q = seg[:1]
        if q in "'\"" and seg[-1:] == q and q not in new and "\\" not in new + seg and "\n" not in new:
            return (s, e, q + new + q)
    elif new is not None and seg.lstrip("-").replace(".", "", 1).replace("_", "").isdigit():
        return (s, e, repr(new))
    return None


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


def _renamed(fn: ast.FunctionDef, src: str, new: str) -> str:
    return re.sub(rf"^(\s*def\s+){re.escape(fn.name)}(\s*\()", rf"\g<1>{new}\g<2>", src, count=1)


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
            s0 = _offset(lines, fn.lineno, 0)
            e0 = _offset(lines, fn.end_lineno, fn.end_col_offset)
            s, e, rep = edit
            clone(key, fn, MUST_FAIL, text[s0:s] + rep + text[e:e0], of)
            made += 1
        return keys

    keys = failing(plain, must_fail, P2P, negate=negate)
    failing(f2p, twins, F2P, negate=False, far=False)
    for key in keys[:must_pass]:
        fn = plain[key]
        src = text[_offset(lines, fn.lineno, 0) : _offset(lines, fn.end_lineno, fn.end_col_offset)]
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
    twins: int = 2,
    **counts: Any,
) -> list[Canary]:
    """Canaries for ``files`` (path -> text as run): clones of PASS_TO_PASS tests from the first file that
    can carry them, and up to ``twins`` near-twins of FAIL_TO_PASS tests from any of the files."""
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
            fail_to_pass=f2p_units.get(path, set()), twins=twins, taken=taken.setdefault(path, set()),
            **counts,
        )  # fmt: skip
        if any(c.of == P2P and c.expect == MUST_FAIL for c in got):
            out = got
            break
        taken.pop(path)
    left = twins - sum(c.of == F2P for c in out)
    others = [p for p, t in files.items() if t and f2p_units.get(p) and p not in {c.path for c in out}]
    rng.shuffle(others)
    for path in others:
        if left <= 0:
            break
        got = plan_for_file(
            path, files[path] or "", set(), rng, family=family, reserved=reserved, must_fail=0, must_pass=0,
            fail_to_pass=f2p_units[path], twins=left,
        )  # fmt: skip
        out += got
        left -= len(got)
    rng.shuffle(out)
    return out


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def place(
    canaries: Sequence[Canary], current: Mapping[str, str | None], rng: random.Random | None = None
) -> CanarySet:
    """Where each canary goes in its file as the run will find it (``current``: path -> that text).

    Each goes after a definition drawn at random among its siblings (a module-level function or class
    for a function, a method of its own class for a method), never always last, so its place in the file
    or in the run's order tells nothing; the whole new text of the file is written. A canary whose file
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
        placed = []
        defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        for c in group:
            if c.cls:
                node = scopes.get(c.cls)
                if not isinstance(node, ast.ClassDef) or not node.body:
                    continue
                first = lines[node.body[0].lineno - 1]
                if _indent(first) != _indent(c.source.split("\n", 1)[0]) or not _indent(first):
                    continue
                after = [n.end_lineno for n in node.body if isinstance(n, defs)] or [node.end_lineno]
                block = ["", c.source.rstrip("\n")]
            else:
                after = [n.end_lineno for n in tree.body if isinstance(n, defs)] or [len(lines)]
                block = ["", "", c.source.rstrip("\n")]
            inserts.setdefault(rng.choice(after), []).extend(block)
            placed.append(c)
        new_lines = []
        for i, line in enumerate(lines, 1):
            new_lines.append(line)
            new_lines.extend(inserts.get(i, []))
        new = "\n".join(new_lines)
        try:
            defined = set(_plain_tests(ast.parse(new)))
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


# ----- checking -----------------------------------------------------------------------------------------
def _same_file(c: Canary, key: str) -> bool:
    """Whether the status key ``key`` names a test of ``c``'s file (sympy's bare names never tell)."""
    if c.family == DJANGO:
        return f"({c.module}." in key
    return c.family == PYTEST and key.startswith(c.path + "::")


def check_canaries(
    canaries: Sequence[Canary],
    statuses: Mapping[str, str],
    test_exit_code: int | None,
    *,
    absent_with_file: bool = False,
) -> str | None:
    """None when every canary reported its known outcome, else a one-line detail of what did not.

    ``absent_with_file``: a canary may be absent when no test of its file is in the log either (the code
    under test broke that file's collection, as a SWE-smith bug may); absent beside its file's tests it
    is still wrong."""
    wrong = []
    for c in canaries:
        got = c.status_in(statuses)
        ok = got in FAIL_STATUSES if c.expect == MUST_FAIL else got == "PASSED"
        if not ok and got is None and absent_with_file:
            ok = not any(_same_file(c, k) for k in statuses)
        if not ok:
            wrong.append(f"{c.name} (must {c.expect}) {got or 'absent'}")
    if wrong:
        return f"{RUNNER_TAMPERED}: canary tests reported wrongly: " + ", ".join(wrong)
    if test_exit_code == 0 and any(c.expect == MUST_FAIL and c.status_in(statuses) for c in canaries):
        return f"{RUNNER_TAMPERED}: the test command exited 0 although a canary test failed"
    return None


def forged_pass(canaries: Sequence[Canary], statuses: Mapping[str, str]) -> bool:
    """Whether a must-fail canary was reported passing: no honest run does that."""
    return any(c.expect == MUST_FAIL and c.status_in(statuses) == "PASSED" for c in canaries)


def without(statuses: Mapping[str, str], canaries: Sequence[Canary]) -> dict[str, str]:
    """The status map without the canaries' ids (evidence and F2P/P2P derivation never see them)."""
    ids = {i for c in canaries for i in c.ids}
    return {k: v for k, v in statuses.items() if k not in ids}


_SECTION = re.compile(r"^_{3,} (.+?) _{3,}$")


def scrub_output(text: str, canaries: Sequence[Canary]) -> str:
    """``text`` (a pytest log) without the canaries: their failure sections (from a ``____ name ____``
    header to the next header or ``===`` line) and every line naming one. For output that outlives the
    run (SWE-smith's failing output, which problem statements are written from)."""
    names = {c.name for c in canaries}
    if not names:
        return text
    named = re.compile(r"\b(?:" + "|".join(re.escape(n) for n in sorted(names)) + r")\b")
    out, skipping = [], False
    for line in text.split("\n"):
        head = _SECTION.match(line)
        if head or line.startswith("="):
            skipping = bool(head and named.search(head.group(1)))
        if skipping or named.search(line):
            continue
        out.append(line)
    return "\n".join(out)


def summary_expected(test_command: str) -> bool:
    """Whether pytest prints a closing summary under this command (``-qq`` and ``-p no:terminal`` do not)."""
    words = shlex.split(test_command) if test_command.count("'") % 2 == 0 else test_command.split()
    return not any(w.startswith("-qq") for w in words) and "no:terminal" not in test_command


def runner_finished(section: str) -> str | None:
    """None when a pytest log's test section ends the way pytest ends a run, else why not.

    pytest's closing summary (``=== 3 failed, 10 passed in 1.2s ===``, bare under ``-q``, or the
    ``Results (0.8s):`` block of pytest-sugar/pytest-pretty) must be there, and its passed count must
    equal the distinct PASSED lines (``-rA``'s short summary when present, else the verbose
    ``path::id PASSED`` lines).
    """
    lines = section.split("\n")
    body = None
    for i, line in enumerate(lines):
        m = _SUMMARY.match(line)
        if m:
            body = m.group("body")
        elif _RESULTS_BLOCK.match(line):
            got = []
            for nxt in lines[i + 1 :]:
                r = _RESULTS_LINE.match(nxt)
                if not r:
                    break
                got.append(r.group(1))
            body = ", ".join(got) if got else body
    if body is None:
        return f"{RUNNER_NOT_FINISHED}: no pytest closing summary line in the test output"
    counts = {}
    for n, word in _SUMMARY_COUNT.findall(body):
        counts[word.rstrip("s") if word.startswith(("error", "warning")) else word] = int(n)
    ra = {m.group(1) for m in map(_RA_PASSED.match, lines) if m}
    verbose = {m.group(1) for m in map(_VERBOSE_PASSED.match, lines) if m}
    passed_lines = len(ra) if ra else len(verbose)
    if (ra or verbose) and passed_lines != counts.get("passed", 0):
        return (
            f"{RUNNER_NOT_FINISHED}: pytest's summary says {counts.get('passed', 0)} passed, the log has "
            f"{passed_lines} PASSED lines"
        )
    return None
