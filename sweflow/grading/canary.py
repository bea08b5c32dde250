"""Canary tests: the host's own tests, added to every fresh evaluation, whose outcome the host knows.

The code under test owns the test runner's process (the tests import it), so it can make every test
"pass" (``pytest.Function.runtest = lambda self: None``), print ``PASSED <id>`` for every collected test
and exit, or no-op only the tests it guesses are FAIL_TO_PASS (new in the file, failing without a fix).
No text rule keeps up with that. Canaries turn the question around: after the test patch is applied and
before the test command, the host appends a few tests of its own to a test file the command runs, and
knows what each must report:

- **must fail**: a clone of a PASS_TO_PASS test of that file whose last top-level ``assert a == b``
  expects another value (a changed constant) or the opposite (``!=``); the original passes on the base
  and with any correct fix, so the clone fails on both;
- **must pass**: a verbatim clone of a PASS_TO_PASS test.

Each clone keeps its original's formatting and gets a name built from its siblings' names, drawn at
random per evaluation (``random.SystemRandom``): to a forger it is one more new test that fails without
a fix, like the FAIL_TO_PASS tests. Forging them "passing" is caught; leaving them alone leaves the real
FAIL_TO_PASS tests failing. A canary with the wrong status, or missing from the log, is
``runner_tampered`` (reward 0); so is a test exit status of 0 while a must-fail canary ran. A run that
fails its grade anyway keeps the grade's reason unless a must-fail canary was reported passing (no honest
run does that; an honest run that breaks collection leaves canaries absent and stays e.g.
fail_to_pass_failure). Canaries never enter F2P/P2P counts or the status maps kept as evidence.

Which logs can carry them: the pytest family of parsers (``parse_log_pytest*``, and pytest's verbose
lines), on module-level ``def test_x():`` PASS_TO_PASS tests without arguments or decorators. Other runners
(Django's, sympy's bin/test, unittest-style parsers, the JavaScript/Go/Rust parsers) get none: they are
guarded by the exit-status, contradiction and duplicate checks of the grade, and ``plan_canaries`` returns [] for
them (the evaluation records ``canaries: []``).

``runner_finished`` is the second check here: a pytest run that passes must end with pytest's own closing
summary (``=== N passed ... in 1.2s ===``) inside the test section, and the summary's passed count must
equal the number of distinct PASSED lines of the log (a forger printing ``PASSED`` lines and exiting
leaves no summary, or one that does not add up).
"""

from __future__ import annotations

import ast
import random
import re
import secrets
import shlex
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

RUNNER_TAMPERED = "runner_tampered"
RUNNER_NOT_FINISHED = "runner_not_finished"
MUST_FAIL, MUST_PASS = "fail", "pass"
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
    """One host test: ``path::name``, whether it must ``fail`` or ``pass``, and its source."""

    path: str
    name: str
    expect: str
    source: str
    cloned_from: str

    @property
    def test_id(self) -> str:
        return f"{self.path}::{self.name}"

    def to_dict(self) -> dict[str, str]:
        d = asdict(self)
        d.pop("source")
        return d


def is_pytest_parser(parser) -> bool:
    """Whether ``parser`` reads pytest's output (the family canaries and the summary check cover)."""
    return "pytest" in getattr(parser, "__name__", "")


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


def candidate_files(pass_to_pass: Sequence[str], test_command: str = "") -> list[str]:
    """Python test files holding PASS_TO_PASS tests (those the test command names, when it names any)."""
    files = sorted(
        {t.split("::", 1)[0] for t in pass_to_pass if "::" in t and t.split("::", 1)[0].endswith(".py")}
    )
    named = [f for f in files if f in test_command]
    return named or ([] if any(w.endswith(".py") for w in test_command.split()) else files)


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


def _plain_tests(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """Module-level ``def test_x():`` with no arguments and no decorators, defined once."""
    seen: dict[str, list] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            seen.setdefault(node.name, []).append(node)
    out = {}
    for name, nodes in seen.items():
        fn = nodes[0]
        a = getattr(fn, "args", None)
        if (
            len(nodes) == 1
            and isinstance(fn, ast.FunctionDef)
            and name.startswith("test")
            and not fn.decorator_list
            and a is not None
            and not (a.posonlyargs or a.args or a.vararg or a.kwonlyargs or a.kwarg)
        ):
            out[name] = fn
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
        name = "test_" + "_".join(w for w in head + tail if w)
        if name not in taken and name.isidentifier():
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
    if isinstance(value, int):
        return value + rng.choice([-97, -40, 31, 64, 89, 1000] if far else [-3, -2, -1, 1, 2, 3, 7, 10])
    if isinstance(value, float):
        return value + rng.choice([1.0, 2.5, -1.0, 0.5]) * (abs(value) or 1.0)
    if isinstance(value, str):
        letters = "abcdefghijklmnopqrstuvwxyz"
        i = rng.randint(0, len(value))
        return value[:i] + rng.choice(letters) + value[i:]
    return None


def _failing_edit(
    fn: ast.FunctionDef, text: str, lines: list[str], rng: random.Random, negate: bool = True
) -> tuple[int, int, str] | None:
    """(start, end, replacement) that makes the function's last top-level ``assert x == y`` fail: another
    expected constant, or (``negate``) ``!=``, which is only sound while the tested code is the base's."""
    asserts = [s for s in fn.body if isinstance(s, ast.Assert)]
    if not asserts:
        return None
    last = asserts[-1]
    cmp = last.test
    if not (isinstance(cmp, ast.Compare) and len(cmp.ops) == 1 and isinstance(cmp.ops[0], ast.Eq)):
        return None
    right = cmp.comparators[0]
    options = []
    if isinstance(right, ast.Constant):
        new = _mutated_constant(right.value, rng, far=not negate)
        s = _offset(lines, right.lineno, right.col_offset)
        e = _offset(lines, right.end_lineno, right.end_col_offset)
        seg = text[s:e]
        if new is not None and isinstance(new, str):
            q = seg[:1]
            if (
                q in "'\""
                and seg[-1:] == q
                and q not in new
                and "\\" not in new
                and "\\" not in seg
                and "\n" not in new
            ):
                options.append((s, e, q + new + q))
        elif new is not None and seg.lstrip("-").replace(".", "", 1).replace("_", "").isdigit():
            options.append((s, e, repr(new)))
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
    pass_to_pass: Sequence[str],
    rng: random.Random,
    *,
    must_fail: int = 2,
    must_pass: int = 1,
    negate: bool = True,
) -> list[Canary]:
    """Canaries for one test file (its text as the test command will run it), or [] if none can be made.

    Where the code under test may legitimately differ from the base (SWE-smith's bug runs: a broken
    function makes its tests fail), pass ``must_pass=0, negate=False``: a must-pass clone of a test the
    bug breaks would fail, and ``!=`` would pass once the bug changed the value."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    p2p = {t.split("::", 1)[1] for t in pass_to_pass if t.startswith(path + "::")}
    plain = {n: fn for n, fn in _plain_tests(tree).items() if n in p2p}
    if not plain:
        return []
    lines = text.split("\n")
    taken = _sibling_names(tree)
    siblings = sorted(n for n in taken if n.startswith("test"))
    out: list[Canary] = []
    names = sorted(plain)
    rng.shuffle(names)
    for name in names:
        if sum(c.expect == MUST_FAIL for c in out) >= must_fail:
            break
        fn = plain[name]
        edit = _failing_edit(fn, text, lines, rng, negate)
        if edit is None:
            continue
        s0 = _offset(lines, fn.lineno, 0)
        e0 = _offset(lines, fn.end_lineno, fn.end_col_offset)
        s, e, rep = edit
        src = text[s0:s] + rep + text[e:e0]
        new = _new_name(taken, siblings, rng)
        taken.add(new)
        out.append(Canary(path, new, MUST_FAIL, _renamed(fn, src, new), name))
    for name in names[:must_pass]:
        fn = plain[name]
        src = text[_offset(lines, fn.lineno, 0) : _offset(lines, fn.end_lineno, fn.end_col_offset)]
        new = _new_name(taken, siblings, rng)
        taken.add(new)
        out.append(Canary(path, new, MUST_PASS, _renamed(fn, src, new), name))
    if not any(c.expect == MUST_FAIL for c in out):
        return []  # a must-pass canary alone proves nothing about a forger that passes everything
    rng.shuffle(out)
    return out


def plan_canaries(
    files: Mapping[str, str | None],
    pass_to_pass: Sequence[str],
    rng: random.Random | None = None,
    **counts: int,
) -> list[Canary]:
    """Canaries for the first of ``files`` (path -> text as run) that can carry them, in random order."""
    rng = rng or random.SystemRandom()
    paths = [p for p, t in files.items() if t]
    rng.shuffle(paths)
    for path in paths:
        got = plan_for_file(path, files[path] or "", pass_to_pass, rng, **counts)
        if got:
            return got
    return []


def injection(canaries: Sequence[Canary]) -> str:
    """Shell lines appending the canaries to their files (one heredoc per file, a random delimiter)."""
    out = []
    by_path: dict[str, list[Canary]] = {}
    for c in canaries:
        by_path.setdefault(c.path, []).append(c)
    for path, group in by_path.items():
        delim = f"EOF_{secrets.randbelow(10**12):012d}"
        body = "\n\n\n".join(c.source.rstrip("\n") for c in group)
        out.append(f"cat >> {shlex.quote(path)} <<'{delim}'\n\n\n{body}\n{delim}")
    return "\n".join(out)


def inject(script: str, canaries: Sequence[Canary], start_marker: str | None) -> str:
    """``script`` with the canaries appended to their files just before the start-of-test-output line."""
    if not canaries:
        return script
    lines = script.split("\n")
    at = [i for i, ln in enumerate(lines) if start_marker and start_marker in ln and "<<" not in ln]
    if not at:
        raise ValueError("the eval script has no start-of-test-output line to put canaries before")
    i = at[0]
    return "\n".join(lines[:i] + [injection(canaries)] + lines[i:])


# ----- checking -----------------------------------------------------------------------------------------
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
        got = statuses.get(c.test_id)
        ok = got in FAIL_STATUSES if c.expect == MUST_FAIL else got == "PASSED"
        if not ok and got is None and absent_with_file:
            ok = not any(k.startswith(c.path + "::") for k in statuses)
        if not ok:
            wrong.append(f"{c.name} (must {c.expect}) {got or 'absent'}")
    if wrong:
        return f"{RUNNER_TAMPERED}: canary tests reported wrongly: " + ", ".join(wrong)
    if test_exit_code == 0 and any(c.expect == MUST_FAIL and c.test_id in statuses for c in canaries):
        return f"{RUNNER_TAMPERED}: the test command exited 0 although a canary test failed"
    return None


def forged_pass(canaries: Sequence[Canary], statuses: Mapping[str, str]) -> bool:
    """Whether a must-fail canary was reported passing: no honest run does that."""
    return any(c.expect == MUST_FAIL and statuses.get(c.test_id) == "PASSED" for c in canaries)


def without(statuses: Mapping[str, str], canaries: Sequence[Canary]) -> dict[str, str]:
    """The status map without the canaries' ids (evidence and F2P/P2P derivation never see them)."""
    ids = {c.test_id for c in canaries}
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
