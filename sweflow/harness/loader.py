"""Load the official SWE-bench-style harness package and build eval scripts with it.

Supported: ``swebench`` 4.x, the ``swegym`` fork and ``swebench`` 5.x (their layouts: above ``load_harness``).
Nothing here re-implements the harness: the eval script comes from the package's own builders, and
``register_repos`` only adds rows to the package's own tables.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import re
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sweflow.errors import HarnessError
from sweflow.harness import standalone
from sweflow.schema import default

SUPPORTED_PACKAGES_HINT = "install swebench 4.x or 5.x, or the pinned swegym fork"
ROW_SCRIPT_FIELDS = ("eval_script", "log_parser")  # what a row needs under swebench 5.x
TEST_EXIT_ECHO = 'echo "SWEFLOW_TEST_EXIT_CODE=$?"'
ENV_NAME = "testbed"  # make_test_spec hard-codes the conda env and /testbed
REPO_DIRECTORY = "/testbed"
_TABLES = ("MAP_REPO_VERSION_TO_SPECS", "MAP_REPO_TO_PARSER", "MAP_REPO_TO_EXT")


def _import(name: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            return None
        raise


def _package_only(name: str) -> types.ModuleType | None:
    """The top-level package ``name`` without running its ``__init__`` (a harness's imports its Docker
    builders, dataset collection and CLI: nothing conversion or grading use), or None when not installed. One
    already imported stays as it is; its submodules import as usual through the bare package's path."""
    if name in sys.modules:
        return sys.modules[name]
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return _import(name) if spec is not None else None
    package = types.ModuleType(name)
    package.__file__, package.__package__, package.__spec__ = spec.origin, name, spec
    package.__path__ = list(spec.submodule_search_locations)
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):  # what its __init__ would say
        package.__version__ = importlib.metadata.version(name)
    sys.modules[name] = package
    return package


def _version_of(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"


@dataclass
class Harness:
    """Handles on one installed harness package; create with ``load_harness``."""

    package: str
    make_test_spec: Callable[..., Any]
    test_spec_module: types.ModuleType
    constants: types.ModuleType
    log_parsers: types.ModuleType
    grading: types.ModuleType | None
    start_marker: str | None
    end_marker: str | None
    _registered: dict = field(default_factory=dict)
    row_scripts: bool = False  # swebench 5.x: eval scripts come from the rows, there is no spec table
    _parsers: dict = field(default_factory=dict)

    # ----- tables -------------------------------------------------------------------------------------
    @property
    def suite_ran_pattern(self) -> str | None:
        """The package's own regex for "the runner executed tests" (swebench 5.x ``SUITE_RAN``), if any."""
        pattern = getattr(self.grading, "SUITE_RAN", None)
        return getattr(pattern, "pattern", pattern)

    @property
    def specs_table(self) -> dict:
        return getattr(self.constants, "MAP_REPO_VERSION_TO_SPECS", self._registered)

    @property
    def parser_table(self) -> dict:
        """repo -> parser; under 5.x the union of its per-language tables (plus registered repos)."""
        table = getattr(self.log_parsers, "MAP_REPO_TO_PARSER", None)
        if table is not None:
            return table
        if not self._parsers:
            for mod in self._package_modules():
                for name, obj in vars(mod).items():
                    if name.startswith("MAP_REPO_TO_PARSER_") and isinstance(obj, dict):
                        self._parsers.update(obj)
        return self._parsers

    def _package_modules(self) -> list[types.ModuleType]:
        prefix = f"{self.package}.harness"
        return [m for n, m in sorted(sys.modules.items()) if m is not None and n.startswith(prefix)]

    def _tables(self, name: str) -> list[dict]:
        """Every distinct dict bound to ``name`` in a loaded harness module (forks sometimes copy tables)."""
        seen: dict[int, dict] = {}
        for mod in self._package_modules():
            obj = getattr(mod, name, None)
            if isinstance(obj, dict):
                seen.setdefault(id(obj), obj)
        return list(seen.values())

    def find_parser(self, name: str) -> Callable[..., Any]:
        """The parser function called ``name`` in any of the package's log-parser modules."""
        for mod in self._package_modules():
            if ".log_parsers" in mod.__name__ or mod is self.log_parsers:
                fn = getattr(mod, name, None)
                if callable(fn):
                    return fn
        raise HarnessError(
            f"no log parser named {name!r} in {self.package}.harness.log_parsers", field="parsers"
        )

    def parser_for_instance(self, instance: Mapping[str, Any]) -> Callable[..., Any] | None:
        """The row's own ``log_parser`` (a parser function name, as 5.x rows carry), else by repo."""
        name = instance.get("log_parser")
        return self.find_parser(str(name)) if name else self.parser_for(str(instance.get("repo") or ""))

    def parser_for(self, repo: str) -> Callable[..., Any] | None:
        key = repo_key(self.parser_table, repo)
        return None if key is None else self.parser_table[key]

    def specs_for(self, repo: str) -> dict | None:
        """The package's version -> spec table for ``repo`` (looked up as the package does), or None."""
        key = repo_key(self.specs_table, repo)
        return None if key is None else self.specs_table[key]

    def register_repos(
        self,
        specs: Mapping[str, Mapping[str, Mapping[str, Any]]],
        parsers: Mapping[str, str],
        *,
        ext: str = "py",
    ) -> None:
        """Merge extra repo specs and parser names into the package's own tables (idempotent).

        ``specs``: repo -> version -> spec dict (at least ``test_cmd``); ``parsers``: repo -> the name of a
        parser function in the package (e.g. ``parse_log_pytest``). Each repo is stored under its given name
        and its lower-cased name, since some forks look repos up lower-cased.
        """
        for repo, parser_name in parsers.items():
            fn = self.find_parser(parser_name)
            for table in self._tables("MAP_REPO_TO_PARSER") or [self.parser_table]:
                for key in {repo, repo.lower()}:
                    table[key] = fn
        for repo, versions in specs.items():
            for version, spec in versions.items():
                if "test_cmd" not in spec:
                    raise HarnessError(
                        f"spec for {repo} {version} has no test_cmd", field=f"specs.{repo}.{version}"
                    )
            for key in {repo, repo.lower()}:
                for table in self._tables("MAP_REPO_VERSION_TO_SPECS"):
                    merged = dict(table.get(key, {}))
                    merged.update({str(v): dict(s) for v, s in versions.items()})
                    table[key] = merged
                for table in self._tables("MAP_REPO_TO_EXT"):
                    table.setdefault(key, ext)
        self._registered.update({r: dict(v) for r, v in specs.items()})

    # ----- eval script ----------------------------------------------------------------------------------
    def _check_instance(self, instance: Mapping[str, Any]) -> tuple[str, str]:
        iid = instance.get("instance_id", "?")
        for key in ("instance_id", "repo", "version", "base_commit", "test_patch"):
            if key not in instance:
                raise HarnessError("instance lacks a required field", row=iid, field=key)
        repo, version = instance["repo"], str(instance["version"])
        if self.row_scripts:
            lacking = [k for k in ROW_SCRIPT_FIELDS if not instance.get(k)]
            if lacking:
                raise HarnessError(
                    f"{self.package} {_version_of(self.package)} builds eval scripts only from rows that carry"
                    f" {' and '.join(ROW_SCRIPT_FIELDS)}; this row has no {lacking[0]}",
                    row=iid,
                    field=lacking[0],
                    hint="use swebench>=4,<5 or the swegym fork for SWE-Gym rows",
                )
            return repo, version
        specs = self.specs_for(repo)
        if specs is None:
            raise HarnessError(
                f"repo {repo!r} is unknown to {self.package}",
                row=iid,
                field="repo",
                hint="register it with Harness.register_repos",
            )
        if version not in specs:
            raise HarnessError(
                f"version {version!r} of {repo} is unknown to {self.package}",
                row=iid,
                field="version",
                hint="register it with Harness.register_repos",
            )
        return repo, version

    def eval_script_list(self, instance: Mapping[str, Any]) -> list[str]:
        """The official eval command list for ``instance``, exactly as ``make_test_spec`` computes it.

        When the package's ``make_eval_script_list`` has the standard signature it is called directly with
        the arguments ``make_test_spec`` would pass, which skips the env-script builder (that one downloads
        requirements files from GitHub for some repos); otherwise ``make_test_spec`` itself is used.
        """
        repo, version = self._check_instance(instance)
        inst = dict(instance)
        inst.setdefault("hints_text", "")
        inst["version"] = version
        if self.row_scripts:
            inst.setdefault("image", "")
            inst.setdefault("eval_type", "pass_and_fail")
        builder = self.test_spec_module.__dict__.get("make_eval_script_list")
        params = _parameter_names(builder) if builder else ()
        try:
            if params == ("instance", "specs", "env_name", "repo_directory", "base_commit", "test_patch"):
                return list(
                    builder(
                        inst,
                        self.specs_for(repo)[version],
                        ENV_NAME,
                        REPO_DIRECTORY,
                        inst["base_commit"],
                        inst["test_patch"],
                    )
                )
            return list(self.make_test_spec(inst).eval_script_list)
        except (KeyError, ValueError, TypeError) as exc:
            raise HarnessError(
                f"{self.package} could not build the eval script: {exc!r}", row=inst["instance_id"]
            ) from exc

    def _join(self, commands: list[str]) -> str:
        """Join commands with the package's own ``TestSpec.eval_script`` property."""
        prop = self.test_spec_module.TestSpec.eval_script
        return prop.fget(types.SimpleNamespace(eval_script_list=commands))

    def eval_script(self, instance: Mapping[str, Any], *, instrument: bool = False) -> str:
        """``make_test_spec(instance).eval_script``; with ``instrument`` the test exit code is echoed too."""
        commands = self.eval_script_list(instance)
        if instrument:
            commands = instrument_exit_code(
                commands, self.start_marker, self.end_marker, self._test_cmd(instance)
            )
        return self._join(commands)

    def standalone_parser_source(self, repo: str) -> str:
        """A stdlib-only Python program grading a log for ``repo`` (see ``standalone.standalone_parser_source``)."""
        return standalone.standalone_parser_source(self, repo)

    def evaluator_command(
        self,
        instance: Mapping[str, Any],
        *,
        timeout_sec: int = 1200,
        marker: str = "SWEFLOW_REWARD_JSON=",
    ) -> str:
        """One shell command that runs the eval script and prints the reward marker line (see ``standalone``)."""
        return standalone.evaluator_command(self, instance, timeout_sec=timeout_sec, marker=marker)

    def _test_cmd(self, instance: Mapping[str, Any]) -> str:
        if self.row_scripts:
            return "(the command between the test output markers)"  # no spec table to name it
        cmd = self.specs_for(instance["repo"])[str(instance["version"])]["test_cmd"]
        return cmd[-1] if isinstance(cmd, list) else cmd


@functools.lru_cache(maxsize=64)
def _parameter_names(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The parameter names of ``fn`` (``inspect.signature`` costs more than a row's other checks)."""
    return tuple(inspect.signature(fn).parameters)


def repo_key(table: Mapping[str, Any], repo: str) -> str | None:
    """The key under which ``table`` holds ``repo``, found the way the harness packages look repos up.

    swebench 4.x keys its tables as GitHub spells the repo; the swegym fork lower-cases its tables'
    keys and ``instance["repo"]`` (and derives the repo from the lower-cased instance id when grading).
    So: the name as written, else its lower-cased form, else the one key equal to it ignoring case.
    """
    if repo in table:
        return repo
    if repo.lower() in table:
        return repo.lower()
    folded = [k for k in table if isinstance(k, str) and k.casefold() == repo.casefold()]
    return folded[0] if len(folded) == 1 else None


def instrument_exit_code(commands: list[str], start: str | None, end: str | None, test_cmd: str) -> list[str]:
    """Insert ``echo "SWEFLOW_TEST_EXIT_CODE=$?"`` right after the test command.

    The official list brackets the test command(s) with ``: '<start>'`` / ``: '<end>'`` no-op lines; the echo
    goes just before the end line, so ``$?`` is the last test command's status. Older layouts without the
    markers: after the first command starting with the spec's ``test_cmd``.
    """
    out = list(commands)
    if start and end:
        for form in (": '{}'", "echo '{}'", 'echo "{}"'):
            start_line, end_line = form.format(start), form.format(end)
            if start_line in out and end_line in out[out.index(start_line) :]:
                idx = out.index(end_line, out.index(start_line))
                keep = re.fullmatch(r"(\w+)=\$\?", out[idx - 1])
                if keep:  # swebench 5.x records the status itself: restore $? for our echo
                    return out[:idx] + [f'(exit "${keep.group(1)}")', TEST_EXIT_ECHO] + out[idx:]
                return out[:idx] + [TEST_EXIT_ECHO] + out[idx:]
    for i, cmd in enumerate(out):
        if cmd.startswith(test_cmd):
            return out[: i + 1] + [TEST_EXIT_ECHO] + out[i + 1 :]
    raise HarnessError(f"cannot find the test command {test_cmd!r} in the eval script", field="test_cmd")


# Supported layouts: ``swebench`` 4.x (``harness/test_spec/`` is a package), the ``swegym`` fork
# (``harness/test_spec.py`` is a module) and ``swebench`` 5.x (``make_test_spec`` in ``harness/utils.py``
# builds the script from a row's own ``eval_script``; parsers by name in ``PARSER_REGISTRY`` or by repo in the
# per-language ``MAP_REPO_TO_PARSER_*`` tables).
def load_harness(package: str = default("harness.package")) -> Harness:
    """Import ``<package>.harness`` (swebench 4.x or the swegym fork) and return its handles.

    Raises HarnessError when the package is not installed or its layout is unsupported.
    """
    if _package_only(package) is None:
        raise HarnessError(f"harness package {package!r} is not installed", hint=SUPPORTED_PACKAGES_HINT)
    five = _load_row_script_layout(package)
    if five is not None:
        return five
    try:
        ts_pkg = _import(f"{package}.harness.test_spec")
        ts_mod = (
            _import(f"{package}.harness.test_spec.test_spec")
            if ts_pkg and hasattr(ts_pkg, "__path__")
            else ts_pkg
        )
        constants = _import(f"{package}.harness.constants")
        parsers = _import(f"{package}.harness.log_parsers")
        grading = _import(f"{package}.harness.grading")
    except ImportError as exc:
        raise HarnessError(
            f"harness package {package!r} failed to import: {exc}", hint=SUPPORTED_PACKAGES_HINT
        ) from exc
    missing = [
        what
        for what, ok in (
            ("test_spec.make_test_spec", ts_mod is not None and hasattr(ts_mod, "make_test_spec")),
            ("test_spec.TestSpec", ts_mod is not None and hasattr(ts_mod, "TestSpec")),
            ("constants.MAP_REPO_VERSION_TO_SPECS", hasattr(constants, "MAP_REPO_VERSION_TO_SPECS")),
            ("log_parsers.MAP_REPO_TO_PARSER", hasattr(parsers, "MAP_REPO_TO_PARSER")),
        )
        if not ok
    ]
    if missing:
        raise HarnessError(
            f"harness package {package!r} has an unsupported layout (missing {', '.join(missing)})",
            hint=SUPPORTED_PACKAGES_HINT,
        )
    return _harness(package, ts_mod.make_test_spec, ts_mod, constants, parsers, grading)


def _load_row_script_layout(package: str) -> Harness | None:
    """The swebench 5.x layout (``harness/utils.make_test_spec``, ``types.TestSpec``, ``PARSER_REGISTRY``), or None."""
    try:
        if _import(f"{package}.harness.test_spec") is not None:
            return None
        utils = _import(f"{package}.harness.utils")
        types_mod = _import(f"{package}.types")
        constants = _import(f"{package}.harness.constants")
        parsers = _import(f"{package}.harness.log_parsers")
        grading = _import(f"{package}.harness.grading")
    except ImportError as exc:
        raise HarnessError(
            f"harness package {package!r} failed to import: {exc}", hint=SUPPORTED_PACKAGES_HINT
        ) from exc
    if not (
        hasattr(utils, "make_test_spec")
        and hasattr(types_mod, "TestSpec")
        and hasattr(parsers, "PARSER_REGISTRY")
    ):
        return None
    return _harness(package, utils.make_test_spec, types_mod, constants, parsers, grading, row_scripts=True)


def _harness(package, make_test_spec, test_spec_module, constants, parsers, grading, *, row_scripts=False):
    """The Harness handles of one loaded layout; the output markers come from its constants."""
    return Harness(
        package=package,
        make_test_spec=make_test_spec,
        test_spec_module=test_spec_module,
        constants=constants,
        log_parsers=parsers,
        grading=grading,
        start_marker=getattr(constants, "START_TEST_OUTPUT", None),
        end_marker=getattr(constants, "END_TEST_OUTPUT", None),
        row_scripts=row_scripts,
    )
