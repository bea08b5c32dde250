"""Problem statements for synthesized tasks, the leak checker that guards them, and the versioned prompts.

The prompts live in `sweflow/smith/prompts/*.md` (package data): plain text whose `$name` placeholders are
filled with `string.Template` (values are never re-parsed, so code full of `$` or braces is safe); each
file's sha256 goes into the metadata of what it produced.
"""

from __future__ import annotations

import keyword
import re
import string
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import PurePosixPath
from typing import Any

from ..errors import SmithError
from ..schema import default
from ..util import sha256_bytes
from .lm import LMSettings, complete

PROMPTS = ("lm_modify", "lm_rewrite", "pr_rewrite", "problem_statement")
STATEMENT_SYSTEM = "You write clear, accurate GitHub issues about bugs, as a user of the library would."
MIN_STATEMENT_CHARS = 40
MAX_OUTPUT_CHARS = 8000
_MIN_FIX_LINE = 12
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")
_SOFT_KEYWORDS = set(keyword.kwlist) | set(keyword.softkwlist) | {"self", "cls"}


def _prompt_file(name: str):
    stem = name.removesuffix(".md")
    if stem not in PROMPTS:
        raise SmithError(f"unknown prompt {name!r}", field="prompt", hint=f"one of {PROMPTS}")
    return resources.files("sweflow.smith").joinpath("prompts", f"{stem}.md")


def smith_prompt(name: str) -> str:
    """The text of a versioned synthesis prompt (`lm_modify`, `lm_rewrite`, `pr_rewrite`, `problem_statement`;
    a `.md` suffix is accepted)."""
    return _prompt_file(name).read_text(encoding="utf-8")


def prompt_sha256(name: str) -> str:
    """sha256 of the prompt file's bytes: the prompt version recorded with everything it produced."""
    return sha256_bytes(_prompt_file(name).read_bytes())


def render_prompt(prompt: str, /, **values: str) -> str:
    """The prompt with its `$placeholders` filled; a placeholder without a value is an error."""
    try:
        return string.Template(smith_prompt(prompt)).substitute(values)
    except KeyError as exc:
        raise SmithError(f"prompt {prompt!r} needs a value for ${exc.args[0]}", field="prompt") from None
    except ValueError as exc:
        raise SmithError(f"prompt {prompt!r} has a bad placeholder: {exc}", field="prompt") from None


# ---- the leak checker


def _norm(text: str) -> str:
    return " ".join(text.split())


def _fix_lines(patch: str) -> list[str]:
    out = []
    for line in patch.splitlines():
        if not line.startswith("+") or line.startswith("+++"):
            continue
        text = _norm(line[1:])
        words = [w for w in _WORD.findall(text) if w not in _SOFT_KEYWORDS]
        if len(text) >= _MIN_FIX_LINE and words and text not in out:
            out.append(text)
    return out


def _patch_paths(patch: str) -> list[str]:
    found: list[str] = []
    for line in patch.splitlines():
        m = re.match(r"^diff --git a/(\S+) b/(\S+)$", line) or re.match(r"^(?:---|\+\+\+) [ab]/(\S+)", line)
        for path in m.groups() if m else ():
            if path and path != "/dev/null" and path not in found:
                found.append(path)
    return found


def _path_forms(path: str) -> list[str]:
    base = PurePosixPath(path).name
    return [path] + ([base] if len(base) > 8 and base != path else [])


def _mentions(text: str, path: str) -> bool:
    """`path` occurs in `text` as a name of its own (not as the tail of `test_evaluator.py`)."""
    return re.search(rf"(?<![\w-]){re.escape(path)}(?![\w-])", text) is not None


def leaks(statement: str, *, patch: str, tests: Iterable[str]) -> list[str]:
    """Why `statement` gives the fix away: a line the fix `patch` adds (at least 12 characters, not only
    punctuation and keywords; whitespace-normalised), a test's name or file, or a path the fix changes (or
    its basename when longer than 8 characters). Empty when it is clean."""
    text = _norm(statement)
    reasons: list[str] = []

    def add(reason: str) -> None:
        if reason not in reasons:
            reasons.append(reason)

    for line in _fix_lines(patch):
        if line in text:
            add(f"fix line: {line!r}")
    for test in tests:
        test = str(test)
        file, sep, name = test.rpartition("::")
        names = [name if sep else test]
        base = names[0].split("[", 1)[0]
        if base and base != names[0]:
            names.append(base)
        for n in names:
            if n and n in text:
                add(f"test name: {n}")
                break
        if sep and file:
            file = file.split("::", 1)[0]
            for form in _path_forms(file):
                if _mentions(text, form):
                    add(f"test file: {form}")
                    break
    for path in _patch_paths(patch):
        for form in _path_forms(path):
            if _mentions(text, form):
                add(f"file path: {form}")
                break
    return reasons


# ---- writing a statement


def _bounded(output: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    """The last `limit` characters of a test run (where the failures and the summary are)."""
    if len(output) <= limit:
        return output
    cut = output[-limit:]
    cut = cut[cut.find("\n") + 1 :] if "\n" in cut[:200] else cut
    return f"[... {len(output) - len(cut)} earlier characters omitted ...]\n{cut}"


# A statement is rejected when it gives the fix away (see `leaks`) or is too short; the LM is asked again with
# the reasons, up to `attempts` times.
def write_statement(
    task: Mapping[str, Any],
    *,
    settings: LMSettings,
    failing_output: str,
    attempts: int = default("smith.statements.attempts"),
) -> dict[str, Any]:
    """Ask the LM for an issue-style problem statement for `task` (instance_id, patch = the fix,
    FAIL_TO_PASS, bug_patch) until one is clean; `problem_statement` is None after `attempts` rejections.

    A failed request counts as a rejected attempt (its reason says so), as does a leaking or short text.
    """
    if attempts < 1:
        raise SmithError("attempts must be at least 1", field="attempts")
    for key in ("patch", "bug_patch"):
        if not isinstance(task.get(key), str):
            raise SmithError(f"task lacks its {key}", row=str(task.get("instance_id")), field=key)
    tests = [str(t) for t in task.get("FAIL_TO_PASS") or []]
    base = render_prompt(
        "problem_statement", bug_patch=task["bug_patch"], failing_output=_bounded(failing_output)
    )
    rejected: list[dict[str, Any]] = []
    accepted: str | None = None
    made = 0
    for attempt in range(1, attempts + 1):
        made = attempt
        user = base
        if rejected:
            notes = "\n".join(f"- attempt {r['attempt']}: {'; '.join(r['reasons'])}" for r in rejected)
            user += (
                "\nEarlier drafts were rejected for these reasons; write a new one that avoids them "
                f"(do not repeat fix code, test names or file paths):\n{notes}\n"
            )
        try:
            text = complete(settings, STATEMENT_SYSTEM, user).strip()
        except SmithError as exc:
            rejected.append({"attempt": attempt, "reasons": [f"request failed: {exc}"]})
            continue
        reasons = leaks(text, patch=task["patch"], tests=tests)
        if len(text) < MIN_STATEMENT_CHARS:
            reasons.insert(0, f"too short ({len(text)} characters, at least {MIN_STATEMENT_CHARS})")
        if not reasons:
            accepted = text
            break
        rejected.append({"attempt": attempt, "reasons": reasons})
    record = settings.record()
    return {
        "problem_statement": accepted,
        "attempts": made,
        "rejected": rejected,
        "model": record["model"],
        "endpoint": record["endpoint"],
        "temperature": record["temperature"],
        "prompt_sha256": prompt_sha256("problem_statement"),
    }
