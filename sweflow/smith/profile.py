"""Repository profiles: where a repository comes from and how its tests are run and read.

A profile is a small mapping (inline in the config, or a YAML file) naming the repository, its source and
commit, the install commands, the test command and the log parser (every key is described above
`RepoProfile`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import SmithError
from .candidates import repo_slug

# The SWE-bench image convention the local and Docker providers reproduce (a conda shim at /opt/miniconda3).
DEFAULT_TEST_CMD = "pytest -rA --continue-on-collection-errors"
CONDA_PRE_TEST = "source /opt/miniconda3/bin/activate && conda activate testbed"
_KEYS = {
    "name",
    "repo",
    "source",
    "commit",
    "version",
    "install",
    "test_cmd",
    "log_parser",
    "pre_test",
    "timeout_sec",
    "reference_timeout_sec",
    "min_pass_share",
    "image",
}


# A profile is a small mapping (inline in the config, or a YAML file): `name` (a short key for paths), `repo`
# (owner/name), `source` ("sample" for the embedded sample repository, a local git repository or a plain
# source folder), `commit` (a ref or sha; default HEAD), `version` (the harness spec key), `install` (commands
# run in each fresh sandbox before the tests), `test_cmd` (pytest with per-test lines: `path::test STATUS`,
# past collection errors), `log_parser` (a parser function of the installed harness package), timeouts and the
# share of tests the reference run must pass.
@dataclass(frozen=True)
class RepoProfile:
    name: str
    repo: str
    source: str
    commit: str = "HEAD"
    version: str = "0.1"
    install: tuple[str, ...] = ()
    # pytest stops the whole session at a collection error (a bug that breaks an import); the other
    # modules' results are what tell FAIL_TO_PASS from PASS_TO_PASS
    test_cmd: str = DEFAULT_TEST_CMD
    log_parser: str = "parse_log_pytest"
    pre_test: str = CONDA_PRE_TEST
    timeout_sec: int = 90
    reference_timeout_sec: int = 900
    min_pass_share: float = 0.8
    # a prebuilt environment image (the repository at /testbed at `commit`), needed for E2B
    image: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["install"] = list(self.install)
        return d

    def harness_spec(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The repo -> version -> spec entry the harness package needs to build eval scripts for the tasks."""
        return {
            self.repo: {
                self.version: {
                    "python": "3",
                    "install": " && ".join(self.install) or "true",
                    "test_cmd": self.test_cmd,
                }
            }
        }

    def env_image(self, commit: str) -> str:
        """The environment image name (repository at /testbed at `commit`)."""
        return self.image or f"sweflow-smith/{repo_slug(self.repo).lower()}.{commit[:8]}:latest"


# The embedded sample repository (sweflow/calclib), whose harness spec the sample dataset already uses.
SAMPLE_PROFILE = {
    "name": "calclib",
    "repo": "sweflow/calclib",
    "source": "sample",
    "version": "0.1",
    "test_cmd": DEFAULT_TEST_CMD,
    "log_parser": "parse_log_pytest",
}


def load_profile(entry: str | Mapping[str, Any], *, base: str | os.PathLike = ".") -> RepoProfile:
    """A profile from "sample", a YAML file path, or a mapping; one-line SmithError naming file and field."""
    where = "config smith.repos"
    if entry == "sample":
        data: Mapping[str, Any] = SAMPLE_PROFILE
    elif isinstance(entry, str):
        path = Path(base) / entry
        where = str(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise SmithError(f"cannot read the repository profile: {exc.strerror}", file=where) from exc
        except yaml.YAMLError as exc:
            raise SmithError(f"not YAML: {str(exc).splitlines()[0]}", file=where) from exc
        if not isinstance(data, Mapping):
            raise SmithError("a repository profile is a mapping", file=where)
    elif isinstance(entry, Mapping):
        data = entry
    else:
        raise SmithError(
            f"a profile is 'sample', a file or a mapping, not {type(entry).__name__}", file=where
        )
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise SmithError(f"unknown key {unknown[0]!r}", file=where, field=unknown[0])
    for key in ("name", "repo", "source"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise SmithError("missing or not a string", file=where, field=key)
    repo_slug(data["repo"])
    if not all(c.isalnum() or c in "._-" for c in data["name"]):
        raise SmithError("use letters, digits, '.', '_' or '-'", file=where, field="name")
    install = data.get("install") or ()
    if isinstance(install, str):
        install = (install,)
    if not isinstance(install, list | tuple) or not all(isinstance(c, str) for c in install):
        raise SmithError("must be a command or a list of commands", file=where, field="install")
    for key in ("test_cmd", "log_parser", "pre_test", "commit", "version", "image"):
        if key in data and data[key] is not None and not isinstance(data[key], str | int | float):
            raise SmithError("must be a string", file=where, field=key)
    for key in ("timeout_sec", "reference_timeout_sec"):
        if key in data and (not isinstance(data[key], int) or isinstance(data[key], bool) or data[key] < 1):
            raise SmithError("must be a whole number of seconds, at least 1", file=where, field=key)
    try:
        share = float(data.get("min_pass_share", 0.8))
    except (TypeError, ValueError):
        raise SmithError("must be a number in (0, 1]", file=where, field="min_pass_share") from None
    if not 0 < share <= 1:
        raise SmithError("must be in (0, 1]", file=where, field="min_pass_share")
    source = data["source"]
    if source != "sample" and isinstance(entry, str) and not os.path.isabs(source):
        source = str((Path(base) / entry).parent / source)
    fields = {k: data[k] for k in _KEYS & set(data) if k not in ("install", "source", "min_pass_share")}
    for k in ("commit", "version"):
        if k in fields:
            fields[k] = str(fields[k])
    return RepoProfile(**fields, source=source, install=tuple(install), min_pass_share=share)
