"""What a patch may not touch: tests, and everything that decides how the tests run.

A reward is only as good as the test run behind it, so a patch that edits tests or test infrastructure is
refused (reward 0, a named reason); the full list is above ``check_patch_integrity``, the one entry point.
``patch_paths`` lists what a diff touches.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sweflow.grading.integrity import DEFAULT_RULES, IntegrityRules, is_test_path
from sweflow.grading.reasons import (
    PROHIBITED_TEST_INFRASTRUCTURE,
    PROHIBITED_TEST_MODIFICATION,
    SUSPICIOUS_TEST_TAMPERING,
)

PATCH_TOO_LARGE = "patch_too_large"
_BINARY_SIZE = re.compile(r"^(?:literal|delta) (\d+)$", re.MULTILINE)


@dataclass(frozen=True)
class PatchViolation:
    """One refused change: ``rule`` (test_file, test_infrastructure, test_config, eval_sourced_file,
    install_file, test_patch_file, test_data, compiled_code, tamper_code, unreadable_diff, patch_too_large),
    the ``path``
    and a one-line ``detail``."""

    rule: str
    path: str
    detail: str

    @property
    def reason(self) -> str:
        if self.rule == "test_file":
            return PROHIBITED_TEST_MODIFICATION
        if self.rule == "tamper_code":
            return SUSPICIOUS_TEST_TAMPERING
        if self.rule == PATCH_TOO_LARGE:
            return PATCH_TOO_LARGE
        return PROHIBITED_TEST_INFRASTRUCTURE

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "path": self.path, "detail": self.detail, "reason": self.reason}


# ----- diff reading -------------------------------------------------------------------------------------
def _unquote(p: str) -> str:
    p = p.strip()
    if len(p) >= 2 and p[0] == p[-1] == '"':
        raw = p[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
        return raw.encode("latin-1", "replace").decode("utf-8", "replace")
    return p


def _strip_side(p: str) -> str:
    return p[2:] if p[:2] in ("a/", "b/") else p


def _header_paths(rest: str) -> list[str]:
    """The two paths of a ``diff --git`` header after the command (C-quoted or plain), or [] if unreadable.

    With the pinned ``a/``/``b/`` prefixes an unquoted header is split in the middle (both halves name
    the same path unless it is a rename, whose rename lines name both sides anyway).
    """
    if rest.startswith('"'):
        m = re.match(r'^("(?:[^"\\]|\\.)*")\s+(.+)$', rest)
        if not m:
            return []
        return [_strip_side(_unquote(m.group(1))), _strip_side(_unquote(m.group(2)))]
    half = (len(rest) - 1) // 2
    left, right = rest[:half], rest[half + 1 :]
    if left[:2] == "a/" and right[:2] == "b/" and left[2:] == right[2:]:
        return [left[2:]]
    if right.startswith('"'):
        m = re.match(r'^(\S+)\s+("(?:[^"\\]|\\.)*")$', rest)
        return [_strip_side(m.group(1)), _strip_side(_unquote(m.group(2)))] if m else []
    return []


def _blocks(patch: str) -> list[list[str]]:
    """The patch split into ``diff --git`` blocks (lines before the first header are dropped)."""
    blocks: list[list[str]] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
    return blocks


def _block_paths(block: list[str]) -> set[str]:
    out: set[str] = set()
    in_hunk = False
    for line in block[1:]:
        if line.startswith("@@"):
            in_hunk = True
        elif in_hunk:
            continue
        elif line.startswith(("--- ", "+++ ")):
            p = _unquote(line[4:].split("\t", 1)[0])
            if p != "/dev/null":
                out.add(_strip_side(p))
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            out.add(_unquote(line.split(" ", 2)[2]))
    if not out:  # mode changes and binary files: the header is the only name
        out.update(_header_paths(block[0][len("diff --git ") :]))
    return out


def unreadable_blocks(patch: str) -> list[str]:
    """Header lines of diff blocks whose paths cannot be read (a patch the checks cannot see through)."""
    return [b[0][:200] for b in _blocks(patch) if not _block_paths(b)]


def patch_paths(patch: str) -> list[str]:
    """Every path a git diff touches (both sides of renames/copies), from each block's headers.

    Handles git's C-quoted paths; ``/dev/null`` sides are skipped. Hunk bodies are never read as headers.
    """
    out: set[str] = set()
    for block in _blocks(patch):
        out |= _block_paths(block)
    return sorted(out)


def changed_lines(patch: str) -> dict[str, list[str]]:
    """Per file (new side), the added and removed lines of the diff (without their +/- sign)."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    in_hunk = False
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            current, in_hunk = None, False
            rest = line[len("diff --git ") :]
            if not rest.startswith('"'):
                half = (len(rest) - 1) // 2
                current = _strip_side(rest[half + 1 :])
        elif not in_hunk and line.startswith("+++ "):
            p = _unquote(line[4:].split("\t", 1)[0])
            if p != "/dev/null":
                current = _strip_side(p)
        elif not in_hunk and line.startswith("--- "):
            p = _unquote(line[4:].split("\t", 1)[0])
            if p != "/dev/null" and current is None:
                current = _strip_side(p)
        elif line.startswith("@@"):
            in_hunk = True
        elif in_hunk and current is not None and line[:1] in ("+", "-"):
            out.setdefault(current, []).append(line[1:])
    return out


# ----- what the eval script relies on -------------------------------------------------------------------
_SOURCE = re.compile(r"^\s*(?:source|\.)\s+(\S+)")
_INSTALL = re.compile(
    r"(?:\bpip3?\s+install\b|\bpython[0-9.]*\s+-m\s+pip\s+install\b|\buv\s+pip\s+install\b)[^\n]*"
    r"(?:\s-e\s*\S*|\s\.(?:\[[^\]]*\])?(?:\s|$)|\s\./)"
    r"|\bsetup\.py\s+(?:develop|install|build|build_ext)\b|\bconda\s+develop\b"
)


@dataclass(frozen=True)
class EvalFacts:
    """What the eval script reads from the repository: sourced files, whether it installs the repo, and
    the files of the test patch it applies."""

    sourced: frozenset[str]
    installs_repo: bool
    test_patch_files: frozenset[str]


def _repo_relative(path: str, workdir: str) -> str | None:
    path = path.strip("'\"")
    if path.startswith("/"):
        root = workdir.rstrip("/") + "/"
        return path[len(root) :] if path.startswith(root) else None
    return posixpath.normpath(path)


def eval_script_facts(script: str, workdir: str = "/testbed") -> EvalFacts:
    """Read ``EvalFacts`` off an official eval script (its heredoc holds the test patch verbatim)."""
    sourced = set()
    for line in script.splitlines():
        m = _SOURCE.match(line)
        if m:
            rel = _repo_relative(m.group(1), workdir)
            if rel:
                sourced.add(rel)
    return EvalFacts(
        sourced=frozenset(sourced),
        installs_repo=bool(_INSTALL.search(script)),
        test_patch_files=frozenset(patch_paths(script)),
    )


# ----- the check ----------------------------------------------------------------------------------------
def _matches(name: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


def _test_file(test_id: str) -> str | None:
    """The file part of a test id (``tests/test_x.py::TestA::test_b`` -> ``tests/test_x.py``)."""
    head = str(test_id).split("::", 1)[0].strip()
    return head if head.endswith(".py") else None


def patch_size_violation(patch: str, rules: IntegrityRules = DEFAULT_RULES) -> PatchViolation | None:
    """A patch over ``rules.max_patch_bytes``, or whose binary hunks declare more than
    ``rules.max_applied_bytes`` once inflated; None when within both caps."""
    size = len(patch.encode("utf-8", "surrogateescape"))
    if size > rules.max_patch_bytes:
        return PatchViolation(
            PATCH_TOO_LARGE, "", f"the patch is {size} bytes, over the cap of {rules.max_patch_bytes}"
        )
    declared = sum(int(n) for n in _BINARY_SIZE.findall(patch)) if "GIT binary patch" in patch else 0
    if declared > rules.max_applied_bytes:
        return PatchViolation(
            PATCH_TOO_LARGE,
            "",
            f"its binary hunks inflate to {declared} bytes, over the cap of {rules.max_applied_bytes}",
        )
    return None


def applied_size_violation(size: int, rules: IntegrityRules = DEFAULT_RULES) -> PatchViolation | None:
    """The applied tree's text diff of ``size`` bytes, when over ``rules.max_applied_bytes``."""
    if size > rules.max_applied_bytes:
        return PatchViolation(
            PATCH_TOO_LARGE,
            "",
            f"the applied change is {size} bytes, over the cap of {rules.max_applied_bytes}",
        )
    return None


# A reward is only as good as the test run behind it, so a patch is refused (reward 0, a named reason) when it
# edits, beyond files named like tests (``is_test_path``):
#
# - test infrastructure anywhere: ``conftest.py``, ``sitecustomize.py``/``usercustomize.py``, ``*.pth``,
#   ``pytest.ini``/``tox.ini`` (``IntegrityRules.infra_file_globs``);
# - test settings inside shared config files (``setup.cfg``, ``pyproject.toml``, ...): any changed line that
#   names a test-runner setting (``addopts``, ``deselect``, ``-p`` plugins, ``pytest11`` entry points, ...);
# - files the eval script sources, files it installs (``setup.py``/``pyproject.toml``/... when the script runs
#   an install of the repository), and every file of the task's test patch;
# - compiled code anywhere (``*.pyc``, ``__pycache__/``, ``*.so``, ...:
#   ``IntegrityRules.compiled_file_globs``), also where ignore rules hide it (the fresh sandbox's re-check
#   force-adds every ignored file the apply wrote);
# - test data: non-Python files next to (or below) the test files of FAIL_TO_PASS / PASS_TO_PASS tests;
# - code that reaches for the test run itself: added lines matching ``IntegrityRules.tamper_patterns``
#   (``_pytest`` internals, pytest hook names, ``/proc``, forking and killing, fd juggling, ...).
#
# The last check is a heuristic on the text of the patch; the others are exact.
def check_patch_integrity(
    patch: str,
    *,
    metadata: Mapping[str, Any] | None = None,
    eval_script: str | None = None,
    rules: IntegrityRules = DEFAULT_RULES,
) -> list[PatchViolation]:
    """Every refused change in ``patch`` (see the comment above), test files first; [] when clean.

    ``metadata`` (a training row's) gives the F2P/P2P test ids; ``eval_script`` (the row's official eval
    script) gives the sourced, installed and test-patch files. Both are optional: without them those
    checks are skipped.
    """
    too_large = patch_size_violation(patch, rules)
    if too_large is not None:
        return [too_large]  # not read any further
    meta = metadata or {}
    facts = eval_script_facts(eval_script, rules.workdir) if eval_script else None
    test_dirs = set()
    for tid in list(meta.get("FAIL_TO_PASS") or []) + list(meta.get("PASS_TO_PASS") or []):
        f = _test_file(tid)
        if f:
            test_dirs.add(posixpath.dirname(f))
    lines = changed_lines(patch)
    keywords = [k.lower() for k in rules.test_config_keywords]
    tamper = [re.compile(p) for p in rules.tamper_patterns]
    out: list[PatchViolation] = [
        PatchViolation("unreadable_diff", header, f"cannot tell which file this block changes: {header}")
        for header in unreadable_blocks(patch)
    ]
    for path in patch_paths(patch):
        base = posixpath.basename(path)
        changed = lines.get(path, [])
        if is_test_path(path, rules):
            out.append(PatchViolation("test_file", path, f"edits the test file {path}"))
            continue
        if _matches(base, rules.infra_file_globs):
            out.append(PatchViolation("test_infrastructure", path, f"edits test infrastructure {path}"))
            continue
        if _matches(base, rules.compiled_file_globs) or "__pycache__" in path.split("/"):
            out.append(PatchViolation("compiled_code", path, f"adds or changes compiled code {path}"))
            continue
        if facts is not None:
            if path in facts.test_patch_files:
                out.append(PatchViolation("test_patch_file", path, f"{path} belongs to the test patch"))
                continue
            if path in facts.sourced:
                out.append(PatchViolation("eval_sourced_file", path, f"the eval script sources {path}"))
                continue
            if facts.installs_repo and _matches(base, rules.install_files):
                out.append(PatchViolation("install_file", path, f"the eval script installs from {path}"))
                continue
        if _matches(base, rules.config_files):
            hits = [ln for ln in changed if any(k in ln.lower() for k in keywords)]
            if hits:
                out.append(PatchViolation("test_config", path, f"test settings in {path}: {hits[0][:120]}"))
                continue
        if not base.endswith(".py") and any(path.startswith(d + "/") for d in test_dirs if d):
            out.append(PatchViolation("test_data", path, f"{path} sits beside the task's test files"))
            continue
        for ln in _added_lines(patch, path):
            hit = next((p for p in tamper if p.search(ln)), None)
            if hit is not None:
                out.append(
                    PatchViolation("tamper_code", path, f"{path}: {hit.pattern!r} in {ln.strip()[:120]!r}")
                )
                break
    out.sort(key=lambda v: (v.rule != "test_file", v.rule == "tamper_code"))
    return out


def _added_lines(patch: str, path: str) -> list[str]:
    """The added lines of one file in the diff."""
    out: list[str] = []
    current: str | None = None
    in_hunk = False
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            current, in_hunk = None, False
        elif not in_hunk and line.startswith("+++ "):
            p = _unquote(line[4:].split("\t", 1)[0])
            current = _strip_side(p) if p != "/dev/null" else None
        elif line.startswith("@@"):
            in_hunk = True
        elif in_hunk and current == path and line.startswith("+"):
            out.append(line[1:])
    return out
