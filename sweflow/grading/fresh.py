"""The trusted fresh-sandbox step that grading (``grading.evaluate``) and SWE-smith's candidate validation
(``smith.bug_validation``) both take before they run tests on a patch they do not trust: ``prepare`` resets
the tree and applies the patch, ``applied_diff`` reads back what it did, ``draw_canaries``/``plant_canaries``
add the host's canaries. A provider fault raises SandboxError; nothing here reads a verdict from the sandbox.
"""

from __future__ import annotations

import base64
import random
import shlex
import uuid
from collections.abc import Sequence
from typing import Any

from ..errors import SandboxError
from ..sandbox.base import Sandbox
from . import canary, canary_place, canary_plan
from .integrity import DEFAULT_RULES, IntegrityRules
from .patch_integrity import PatchViolation, applied_size_violation

SETUP_TIMEOUT = 300.0
PATCH_FILE = "/tmp/.sweflow/patch.diff"
FRESH_DIFF_FILE = "/tmp/.sweflow/fresh.diff"
# The untracked files under ignore rules before the patch is applied: whatever the patch adds beside them
# is force-added to the re-check (``git add -A`` honours .gitignore, and a patch may bring its own).
IGNORED_BEFORE_FILE = "/tmp/.sweflow/ignored-before"
IGNORED_AFTER_FILE = "/tmp/.sweflow/ignored-after"
IGNORED_LIST = "git ls-files -z --others --ignored --exclude-standard"
# git diff options no repository config can change: prefixes, external diff drivers, textconv, colour.
PINNED_DIFF = (
    "-c core.quotepath=true -c diff.noprefix=false -c diff.mnemonicPrefix=false -c diff.external= "
    "-c color.diff=false diff --no-ext-diff --no-textconv --no-color --src-prefix=a/ --dst-prefix=b/"
)
# git options that keep the repository's config from running its own programs in ``git add``
UNHOOKED = "-c core.fsmonitor=false -c core.hooksPath=/dev/null"


def decode(data: bytes) -> str:
    # surrogateescape keeps non-UTF-8 bytes of a diff intact through str and back (see encode).
    return data.decode("utf-8", "surrogateescape")


def encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def alive(sb: Sandbox) -> bool:
    """Whether the sandbox still answers a command."""
    if getattr(sb, "killed", False):
        return False
    try:
        return sb.run("echo sweflow-alive", timeout=60).ok
    except Exception:  # noqa: BLE001 - any fault means the sandbox is gone
        return False


def _must(sb: Sandbox, cmd: str, what: str) -> str:
    r = sb.run(cmd, timeout=SETUP_TIMEOUT)
    if not r.ok:
        raise SandboxError(
            f"{what} failed (exit {r.exit_code}): {(r.stderr or r.stdout).strip()[-300:]}",
            file=sb.template,
            row=sb.id,
        )
    return r.stdout


# A patch up to this size travels inside the setup command (base64; one argument to bash stays under
# Linux's 128 KiB per-argument limit), a larger one as a file: one round trip to the sandbox instead of four.
INLINE_PATCH_BYTES = 48 * 1024
SETUP_FAILED = 97  # the exit status (with SETUP_MARK on stderr) of a reset that failed before the apply
SETUP_MARK = "sweflow-setup-failed"


def prepare(sb: Sandbox, workdir: str, base: str, patch: str) -> str | None:
    """Reset ``workdir`` to ``base`` and apply ``patch``; the apply error text, or None on success."""
    return prepare_reading(sb, workdir, base, patch)[0]


def prepare_reading(
    sb: Sandbox, workdir: str, base: str, patch: str, at_base: Sequence[str] = ()
) -> tuple[str | None, dict[str, str | None]]:
    """``prepare``, also reading the files ``at_base`` as ``read_at_base`` does, in the same command.

    ``git reset --hard && git clean -fd``, then the untracked files under ignore rules are listed (for
    ``applied_diff``), the files are read from ``base``'s objects, the patch is written and ``git
    apply --binary``-ed: one command for all of it when the patch is small (a failure before the apply is
    told apart by its exit status and mark). The texts are not read when the apply fails."""
    wd, b = shlex.quote(workdir), shlex.quote(base)
    reset = f"cd {wd} && git reset -q --hard {b} && git clean -fdq"
    reads, out = _framed([f"git show {shlex.quote(base + ':' + p)}" for p in at_base])
    reset += f" && {reads}" if at_base else ""
    if not patch.strip():
        _must(sb, reset, f"resetting {workdir} to {base}")
        return None, _texts(sb, out, at_base)
    data = encode(patch)
    setup = f"{reset} && mkdir -p /tmp/.sweflow && {IGNORED_LIST} > {IGNORED_BEFORE_FILE}"
    if len(data) <= INLINE_PATCH_BYTES:
        setup += f" && printf %s {base64.b64encode(data).decode('ascii')} | base64 -d > {PATCH_FILE}"
    else:
        _must(sb, setup, f"resetting {workdir} to {base}")
        sb.write_file(PATCH_FILE, data)
        setup = f"cd {wd}"
    r = sb.run(
        f"{{ {setup}; }} || {{ echo {SETUP_MARK} >&2; exit {SETUP_FAILED}; }}; "
        f"git apply --binary --whitespace=nowarn {PATCH_FILE}",
        timeout=SETUP_TIMEOUT,
    )
    if r.ok:
        return None, _texts(sb, out, at_base)
    if r.exit_code == SETUP_FAILED and SETUP_MARK in r.stderr:
        raise SandboxError(
            f"resetting {workdir} to {base} failed: {r.stderr.replace(SETUP_MARK, '').strip()[-300:]}",
            file=sb.template,
            row=sb.id,
        )
    if r.timed_out or r.exit_code < 0 or not alive(sb):
        raise SandboxError(
            f"git apply did not finish (exit {r.exit_code}{', timed out' if r.timed_out else ''})",
            file=sb.template,
            row=sb.id,
        )
    return f"git apply failed (exit {r.exit_code}): {(r.stderr + r.stdout).strip()}", {}


def applied_diff(
    sb: Sandbox, workdir: str, base: str, rules: IntegrityRules = DEFAULT_RULES
) -> str | PatchViolation:
    """The applied change as a text diff (every file as text, no drivers) from the fresh sandbox, by this
    sandbox's git with pinned options (no hooks, no drivers, no prefixes the repository's config can change).

    Files the patch created under ignore rules (a ``.pyc`` in a gitignored ``__pycache__``, or one the
    patch's own ``.gitignore`` hides) are force-added, so the re-check sees every file the apply wrote.
    A diff over ``rules.max_applied_bytes`` is never read: the patch_too_large violation instead.
    """
    wd, b = shlex.quote(workdir), shlex.quote(base)
    # the ignored files now that were not there before (NUL-separated, byte-sorted) are force-added; every
    # step is chained with && through files, so a failing sort or comm fails the step (an infrastructure
    # error) instead of force-adding nothing and hiding what the patch wrote under ignore rules
    before, after = f"{IGNORED_BEFORE_FILE}.sorted", f"{IGNORED_AFTER_FILE}.sorted"
    added = f"{IGNORED_AFTER_FILE}.added"
    out = _must(
        sb,
        f"cd {wd} && {IGNORED_LIST} > {IGNORED_AFTER_FILE} && git {UNHOOKED} add -A"
        f" && LC_ALL=C sort -z {IGNORED_BEFORE_FILE} > {before} && LC_ALL=C sort -z {IGNORED_AFTER_FILE} > {after}"
        f" && LC_ALL=C comm -z -13 {before} {after} > {added}"
        f" && xargs -0 -r git {UNHOOKED} add -f -- < {added}"
        f" && git {PINNED_DIFF} --cached --text {b} > {FRESH_DIFF_FILE} && wc -c < {FRESH_DIFF_FILE}",
        "diffing the applied patch",
    )
    size = (out.strip().splitlines() or ["0"])[-1].strip()
    too_large = applied_size_violation(int(size) if size.isdigit() else 0, rules)
    if too_large is not None:
        return too_large
    data = sb.read_file(FRESH_DIFF_FILE)
    return applied_size_violation(len(data), rules) or decode(data)


def _framed(commands: Sequence[str]) -> tuple[str, str]:
    """A shell step (run in the work tree) that writes what each command prints into one file, framed as
    ``<index> <size>\n<bytes>`` (a failing command leaves no frame), and that file's path."""
    out = f"/tmp/.sweflow/read-{uuid.uuid4().hex}"
    parts = [
        f'if {{ {c}; }} > {out}.part 2>/dev/null; then printf "%s %s\\n" {i} "$(wc -c < {out}.part)";'
        f" cat {out}.part; fi"
        for i, c in enumerate(commands)
    ]
    return f"mkdir -p /tmp/.sweflow && {{ {'; '.join(parts)}; }} > {out}", out


def _unframed(data: bytes, n: int) -> list[bytes | None]:
    got, at = [None] * n, 0
    while at < len(data):
        eol = data.index(b"\n", at)
        index, size = (int(x) for x in data[at:eol].split())
        got[index], at = data[eol + 1 : eol + 1 + size], eol + 1 + size
    return got


def _texts(sb: Sandbox, out: str, paths: Sequence[str]) -> dict[str, str | None]:
    """The texts ``_framed`` wrote for ``git show`` of each path (read back by the provider)."""
    if not paths:
        return {}
    shown = _unframed(sb.read_file(out), len(paths))
    return {p: None if d is None else decode(d) for p, d in zip(paths, shown, strict=True)}


def _read_many(sb: Sandbox, workdir: str, commands: Sequence[str]) -> list[bytes | None]:
    """What each shell command prints (None where it fails), from one command and one file read: each
    output framed as ``<index> <size>\n<bytes>``, read back by the provider, not through a log."""
    if not commands:
        return []
    step, out = _framed(commands)
    _must(sb, f"cd {shlex.quote(workdir)} && {step}", "reading files")
    return _unframed(sb.read_file(out), len(commands))


def read_at_base(sb: Sandbox, workdir: str, base: str, paths: Sequence[str]) -> dict[str, str | None]:
    """Each path's text at ``base`` by the sandbox's git (None: absent there or unreadable)."""
    shown = _read_many(sb, workdir, [f"git show {shlex.quote(base + ':' + p)}" for p in paths])
    return {p: None if d is None else decode(d) for p, d in zip(paths, shown, strict=True)}


def read_current(sb: Sandbox, workdir: str, paths: Sequence[str]) -> dict[str, str | None]:
    """Each path's text in the sandbox's tree now (None: absent or unreadable), read by the provider."""
    texts: dict[str, str | None] = {}
    for path in paths:
        try:
            texts[path] = decode(sb.read_file(f"{workdir.rstrip('/')}/{path}"))
        except SandboxError:
            texts[path] = None
    return texts


def canary_files(
    passing: Sequence[str],
    test_command: str = "",
    *,
    rng: random.Random,
    max_files: int = 3,
    family: str = canary.PYTEST,
    fail_to_pass: Sequence[str] = (),
) -> list[str]:
    """The test files canaries may be cloned from: up to ``2 * max_files`` the command runs that hold
    ``passing`` tests (drawn at random), then up to four holding ``fail_to_pass`` tests."""
    files = canary_plan.candidate_files(list(passing), test_command, family)
    rng.shuffle(files)
    twin_files = [
        f
        for f in canary_plan.candidate_files(list(fail_to_pass), test_command, family)
        if f not in files[:max_files]
    ]
    return files[: max_files * 2] + twin_files[:4]


def draw_canaries(
    sb: Sandbox,
    workdir: str,
    base: str,
    passing: Sequence[str],
    test_command: str = "",
    *,
    test_patch: str = "",
    rng: random.Random | None = None,
    max_files: int = 3,
    family: str = canary.PYTEST,
    reserved: Sequence[str] = (),
    fail_to_pass: Sequence[str] = (),
    at_base: dict[str, str | None] | None = None,
    **counts: Any,
) -> canary.CanarySet:
    """Canaries cloned from ``passing`` tests (those known to pass without the patch) of the
    ``canary_files`` and near-twins of the ``fail_to_pass`` tests, from the files read at the base (so no
    edit of the patch decides what can be cloned; ``at_base``: those texts as ``prepare_reading`` read
    them for ``canary_files`` drawn with this ``rng``), ``test_patch`` applied host-side; placed in the files
    as the run will find them: a file the test patch writes as the host's apply leaves it, any other as the
    tree holds it now."""
    rng = rng or random.SystemRandom()
    if at_base is None:
        wanted = canary_files(
            passing, test_command, rng=rng, max_files=max_files, family=family, fail_to_pass=fail_to_pass
        )
        at_base = read_at_base(sb, workdir, base, wanted) if wanted else {}
    if not at_base:
        return canary.CanarySet()
    texts: dict[str, str | None] = {}
    # every file read is offered to the plan, which takes the first that can carry must-fail clones: a cap
    # below what was read left a run unguarded whenever the shuffle put the one cloneable file past it
    for path, text in at_base.items():
        if text is not None or f"b/{path}" in test_patch:  # (a file the test patch creates too)
            texts[path] = canary_place.apply_to(path, text, test_patch)
    planned = canary_plan.plan_canaries(
        texts,
        list(passing),
        rng,
        family=family,
        test_command=test_command,
        reserved=reserved,
        fail_to_pass=list(fail_to_pass),
        **counts,
    )
    paths = sorted({c.path for c in planned})
    patched = {p for p in paths if f"b/{p}" in test_patch}
    current = {p: texts[p] for p in patched} | read_current(
        sb, workdir, [p for p in paths if p not in patched]
    )
    return canary_place.place(planned, current, rng)


def plant_canaries(sb: Sandbox, workdir: str, canaries: canary.CanarySet | Sequence[canary.Canary]) -> None:
    """Plant the canaries in their files in the sandbox's tree now (SWE-smith's runs, which have no eval
    script to carry them; grading puts them into its host script, after the script's own test patch)."""
    if canaries:
        _must(sb, f"cd {shlex.quote(workdir)} && {canary_place.injection(canaries)}", "planting the canaries")
