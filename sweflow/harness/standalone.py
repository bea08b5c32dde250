"""The standalone parser program and the one-line evaluator command that runs inside a task sandbox.

The program = our driver (``driver.py``, read as text) + the harness package's own log-parser source
(``inspect.getsource`` of the parser a repo maps to, plus the TestStatus enum and the helpers it uses,
inlined) + a two-line entry point. It needs only a Python 3.7+ standard library, no sweflow, no harness.
"""

from __future__ import annotations

import base64
import functools
import gzip
import importlib.metadata
import inspect
import json
import re
import shlex
import sys
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from sweflow.errors import HarnessError
from sweflow.harness import driver

DRIVER_PATH = Path(driver.__file__)
WORKDIR = "/tmp/sweflow_eval"
PARSER_FILE = f"{WORKDIR}/parser.py"
_LITERALS = (str, int, float, bool, type(None), bytes)


class LoadedHarness(Protocol):
    """What the program and the command need of a loaded harness package (``sweflow.harness.loader.Harness``,
    which calls this module for its ``standalone_parser_source`` and ``evaluator_command``)."""

    package: str
    start_marker: str | None
    end_marker: str | None

    def parser_for(self, repo: str) -> Callable[..., Any] | None: ...

    def parser_for_instance(self, instance: Mapping[str, Any]) -> Callable[..., Any] | None: ...

    def eval_script(self, instance: Mapping[str, Any], *, instrument: bool = False) -> str: ...


def _is_literal(value: Any) -> bool:
    if isinstance(value, _LITERALS):
        return True
    if isinstance(value, (tuple, list, set, frozenset)):
        return all(_is_literal(v) for v in value)
    if isinstance(value, dict):
        return all(_is_literal(k) and _is_literal(v) for k, v in value.items())
    return False


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _is_stdlib(module_name: str) -> bool:
    return module_name.split(".")[0] in sys.stdlib_module_names


class _Inliner:
    """Collects the source of a parser function and everything it references, in definition order."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.imports: list[str] = []
        self.constants: list[str] = []
        self.classes: list[str] = []
        self.functions: list[str] = []
        self.aliases: list[str] = []
        self.bound: dict[str, Any] = {}

    def _bind(self, name: str, obj: Any) -> bool:
        """Record that ``name`` means ``obj``; False if already bound to it, error if bound to another."""
        if name in self.bound:
            if self.bound[name] is obj or (_is_literal(obj) and self.bound[name] == obj):
                return False
            raise HarnessError(
                f"cannot inline {name!r}: two different objects share the name", field="parsers"
            )
        self.bound[name] = obj
        return True

    def _add_globals(self, names: set[str], globs: Mapping[str, Any]) -> None:
        for name in sorted(names):
            if name in globs and not (name.startswith("__") and name.endswith("__")):
                self.add(name, globs[name])

    def add(self, name: str, obj: Any) -> None:
        if not self._bind(name, obj):
            return
        if isinstance(obj, types.ModuleType):
            if not _is_stdlib(obj.__name__):
                raise HarnessError(f"parser uses non-stdlib module {obj.__name__!r}", field="parsers")
            stmt = f"import {obj.__name__}" if obj.__name__ == name else f"import {obj.__name__} as {name}"
            self.imports.append(stmt)
        elif isinstance(obj, types.FunctionType) and _is_stdlib(obj.__module__ or ""):
            self.imports.append(f"from {obj.__module__} import {obj.__name__} as {name}")
        elif isinstance(obj, types.FunctionType):
            self._add_function(name, obj)
        elif isinstance(obj, type) and _is_stdlib(obj.__module__):
            self.imports.append(f"from {obj.__module__} import {obj.__qualname__} as {name}")
        elif isinstance(obj, type):
            self._add_class(name, obj)
        elif _is_literal(obj):
            self.constants.append(f"{name} = {obj!r}")
        elif isinstance(obj, re.Pattern) and _is_literal(obj.pattern):
            # a module-level compiled regex (swebench 5.x parsers use them): recompiled from its source
            self.imports.append("import re")
            self.constants.append(f"{name} = re.compile({obj.pattern!r}, {int(obj.flags)})")
        else:
            raise HarnessError(
                f"cannot inline {name!r} ({type(obj).__name__}) from the parser module", field="parsers"
            )

    def _add_function(self, name: str, fn: types.FunctionType) -> None:
        if fn.__name__ != name:
            self.add(fn.__name__, fn)
            self.aliases.append(f"{name} = {fn.__name__}")
            return
        self.functions.append(inspect.getsource(fn).rstrip() + "\n")
        self._add_globals(_code_names(fn.__code__), fn.__globals__)

    def _add_class(self, name: str, cls: type) -> None:
        if cls.__name__ != name:
            self.add(cls.__name__, cls)
            self.aliases.append(f"{name} = {cls.__name__}")
            return
        for base in cls.__bases__:
            if base is not object:
                self.add(base.__name__, base)
        self.classes.append(inspect.getsource(cls).rstrip() + "\n")
        globs = vars(sys.modules[cls.__module__])
        for member in vars(cls).values():
            if isinstance(member, types.FunctionType) and member.__qualname__.startswith(
                cls.__qualname__ + "."
            ):
                self._add_globals(_code_names(member.__code__), globs)

    def render(self) -> str:
        parts = sorted(set(self.imports)) + [""] + self.constants + [""]
        parts += [c + "\n" for c in self.classes] + [f + "\n" for f in self.functions] + self.aliases
        return "\n".join(parts).strip() + "\n"


def _package_version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def standalone_parser_source(harness: LoadedHarness, repo: str, parser: Any = None) -> str:
    """A self-contained Python 3 program grading one log for ``repo``; see the module docstring.

    Usage inside a sandbox: ``python3 prog.py --log LOG --tests TESTS.json --eval-returncode N
    [--marker M]``; TESTS.json holds FAIL_TO_PASS, PASS_TO_PASS (and instance_id, repo, version). It prints
    exactly one marker line. A repo without a parser yields a program reporting ``missing_parser``.
    ``parser`` (a function of the package) overrides the repo's table entry.
    """
    parser = parser or harness.parser_for(repo)
    key = (harness.package, repo, parser, harness.start_marker, harness.end_marker)
    try:
        hash(parser)
    except TypeError:  # not a function (so not inlinable): building the program reports it
        return _parser_program.__wrapped__(*key)
    return _parser_program(*key)


@functools.lru_cache(maxsize=256)
def _parser_program(package: str, repo: str, parser: Any, start: str | None, end: str | None) -> str:
    """The program of ``standalone_parser_source``, built once per distinct input and then reused.

    Every input the text depends on is in the key: the package (its version is fixed for the process), the
    repo (named in the header), the parser function itself and the output markers. Building it means
    reading the driver and re-parsing the parser's module with ``inspect`` (milliseconds), and every row
    of a repo embeds the same program. A failure (HarnessError) is not cached: it is raised again each time.
    """
    text = DRIVER_PATH.read_text(encoding="utf-8").rstrip() + "\n\n\n"
    header = f"# ---- log parser inlined from {package} {_package_version(package)} for {repo} ----\n"
    driver_names = set(vars(driver))
    if parser is None:
        body, parser_name = "", "None"
    else:
        inl = _Inliner(package)
        for name, obj in vars(driver).items():
            if isinstance(obj, types.ModuleType):  # the driver's own imports may be shared (re, json, sys)
                inl.bound[name] = obj
        inl.add(parser.__name__, parser)
        clash = sorted(n for n in inl.bound if n in driver_names and inl.bound[n] is not vars(driver)[n])
        if clash:
            raise HarnessError(f"parser names clash with the driver: {', '.join(clash)}", field="parsers")
        body, parser_name = inl.render(), parser.__name__
    footer = (
        f"\n\nSWEFLOW_PARSER = {parser_name}\n"
        f"SWEFLOW_START = {start!r}\n"
        f"SWEFLOW_END = {end!r}\n\n"
        'if __name__ == "__main__":\n'
        "    sys.exit(main(sys.argv[1:], SWEFLOW_PARSER, SWEFLOW_START, SWEFLOW_END))\n"
    )
    return text + header + body + footer


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return list(json.loads(value)) if value.strip() else []
    return [str(v) for v in value]


def expected_tests(instance: Mapping[str, Any]) -> dict[str, Any]:
    """The tests file the program reads: ids and the F2P/P2P lists (JSON strings or sequences accepted)."""
    return {
        "FAIL_TO_PASS": _as_list(instance.get("FAIL_TO_PASS")),
        "PASS_TO_PASS": _as_list(instance.get("PASS_TO_PASS")),
        "instance_id": instance.get("instance_id", ""),
        "repo": instance.get("repo", ""),
        "version": str(instance.get("version", "")),
    }


def pack(data: str) -> str:
    """gzip (mtime 0, level 9: deterministic bytes) + base64, no newlines."""
    return base64.b64encode(gzip.compress(data.encode("utf-8"), compresslevel=9, mtime=0)).decode("ascii")


# The parser program is the same text for every row of a repo: its packed form is computed once too.
_pack_program = functools.lru_cache(maxsize=256)(pack)


def grading_mode(harness: Any, instance: Mapping[str, Any]) -> dict[str, Any]:
    """What a fail-only row adds to its grading inputs: the eval type and the harness's suite-ran pattern."""
    if instance.get("eval_type") != driver.EVAL_TYPE_FAIL_ONLY:
        return {}
    return {"eval_type": driver.EVAL_TYPE_FAIL_ONLY, "suite_ran": getattr(harness, "suite_ran_pattern", None)}


def evaluator_files(harness: LoadedHarness, instance: Mapping[str, Any]) -> dict[str, str]:
    """The three files the evaluator writes: eval script (instrumented), parser program, expected tests."""
    tests = {**expected_tests(instance), **grading_mode(harness, instance)}
    return {
        f"{WORKDIR}/eval.sh": harness.eval_script(instance, instrument=True),
        PARSER_FILE: standalone_parser_source(
            harness, instance["repo"], harness.parser_for_instance(instance)
        ),
        f"{WORKDIR}/tests.json": json.dumps(tests, sort_keys=True, separators=(",", ":")),
    }


def evaluator_command(
    harness: LoadedHarness,
    instance: Mapping[str, Any],
    *,
    timeout_sec: int = 1200,
    marker: str = driver.DEFAULT_REWARD_MARKER,
) -> str:
    """One POSIX-sh command: unpack the files, run the eval script under ``timeout`` into a log, grade it.

    stdout carries only the program's marker line (the eval output goes to ``/tmp/sweflow_eval/eval.log``).
    Exit status 124 of ``timeout`` is graded as ``eval_timeout``. The string is deterministic for a given
    instance and harness version. Keep it under the kernel's 128 KiB single-argument limit when passing it
    as ``bash -c`` (``evaluator_files`` gives the parts for uploading instead).
    """
    if int(timeout_sec) <= 0:
        raise HarnessError(f"timeout_sec must be positive, got {timeout_sec}", field="timeout_sec")
    files = evaluator_files(harness, instance)
    steps = [f"rm -rf {WORKDIR} && mkdir -p {WORKDIR}"]
    for path, text in files.items():
        packed = _pack_program(text) if path == PARSER_FILE else pack(text)
        steps.append(f"printf '%s' '{packed}' | base64 -d | gzip -dc > {path}")
    unpack = " && ".join(steps)
    run = (
        f"timeout -k 30 {int(timeout_sec)} bash {WORKDIR}/eval.sh > {WORKDIR}/eval.log 2>&1; "
        "sweflow_rc=$?; "
        "sweflow_py=$(command -v python3 || command -v python || echo /opt/miniconda3/bin/python3); "
        f'"$sweflow_py" {WORKDIR}/parser.py --log {WORKDIR}/eval.log --tests {WORKDIR}/tests.json '
        f'--eval-returncode "$sweflow_rc" --marker {shlex.quote(marker)}'
    )
    return f"{{ {unpack}; }} && {{ {run}; }}"


def unpack_command(command: str) -> dict[str, str]:
    """Decode the files embedded in an evaluator command (for tests and audits)."""
    out = {}
    for chunk in command.split("printf '%s' '")[1:]:
        b64, rest = chunk.split("'", 1)
        path = rest.split("> ", 1)[1].split()[0].rstrip(";")
        out[path] = gzip.decompress(base64.b64decode(b64)).decode("utf-8")
    return out
