"""Fresh-sandbox evaluation: take the agent's patch out of its sandbox, grade it in a new one, get a reward.

Typical use (the rollout dispatcher)::

    got = extract_patch(agent_sandbox, meta["base_commit"])
    if got.failure_reason:                       # empty_generation / prohibited_test_modification / ...
        reward = 0.0
    else:
        res = evaluate_patch(provider, meta["sandbox_image"], meta, got.patch)
        reward = res.reward                      # 1.0 only when the harness marker says resolved

The agent's sandbox is never trusted for grading: the patch is applied to a NEW sandbox from the same
template, reset to the base commit, and the row's after-agent evaluator command runs there in the
background while we poll it (no request is held open for the whole test run).
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import EvalError, SandboxError
from .harness.driver import DEFAULT_REWARD_MARKER
from .integrity import is_test_path
from .reward import parse_marker, reward_from_payload
from .sandbox.base import Provider, Sandbox
from .util import retry

log = logging.getLogger("sweflow.evaluate")

EMPTY_GENERATION = "empty_generation"
PROHIBITED_TEST_MODIFICATION = "prohibited_test_modification"
PATCH_EXTRACTION_FAILED = "patch_extraction_failed"
FAILED_APPLY_PATCH = "failed_apply_patch"
FRESH_EVAL_EXCEPTION = "fresh_eval_exception"
FRESH_EVAL_TIMEOUT = "fresh_eval_timeout"

PATCH_FILE = "/tmp/.sweflow/patch.diff"
OUTPUT_TAIL_CHARS = 4000
SETUP_TIMEOUT = 300.0
# Time allowed beyond the evaluator's own timeout before the fresh evaluation is abandoned.
DEADLINE_GRACE = 120.0
MAX_POLL_ERRORS = 3


# ----- patch extraction ---------------------------------------------------------------------------------
@dataclass
class PatchResult:
    """The agent's change as a binary git diff against the base commit.

    ``failure_reason`` is None for a gradable patch, else empty_generation, prohibited_test_modification
    (``test_files`` names the offending paths) or patch_extraction_failed (``error`` says why).
    """

    patch: str
    failure_reason: str | None
    test_files: list[str] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _decode(data: bytes) -> str:
    # surrogateescape keeps non-UTF-8 bytes of a diff intact through str and back (see _encode).
    return data.decode("utf-8", "surrogateescape")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def patch_paths(patch: str) -> list[str]:
    """Every path a git diff touches (both sides of renames/copies), from its ``diff --git`` headers.

    Handles git's C-quoted paths; ``/dev/null`` sides are skipped.
    """
    out: set[str] = set()
    for line in patch.splitlines():
        if line.startswith(("--- ", "+++ ")):
            p = _unquote(line[4:].split("\t", 1)[0])
            if p != "/dev/null":
                out.add(p[2:] if p[:2] in ("a/", "b/") else p)
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            out.add(_unquote(line.split(" ", 2)[2]))
        elif line.startswith("diff --git "):
            rest = line[len("diff --git ") :]
            if rest.startswith('"'):
                continue  # quoted names also appear unambiguously in ---/+++ or rename lines
            # Unquoted "a/X b/X": for pure mode changes / binary files this is the only header.
            half = (len(rest) - 1) // 2
            left, right = rest[:half], rest[half + 1 :]
            if left[2:] == right[2:] and left[:2] == "a/" and right[:2] == "b/":
                out.add(left[2:])
    return sorted(out)


def _unquote(p: str) -> str:
    p = p.strip()
    if len(p) >= 2 and p[0] == p[-1] == '"':
        raw = p[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
        return raw.encode("latin-1", "replace").decode("utf-8", "replace")
    return p


def check_patch(patch: str) -> tuple[str | None, list[str]]:
    """(failure_reason, test_files) of a patch: empty_generation, prohibited_test_modification or None."""
    if not patch.strip():
        return EMPTY_GENERATION, []
    tests = [p for p in patch_paths(patch) if is_test_path(p)]
    return (PROHIBITED_TEST_MODIFICATION, tests) if tests else (None, [])


def extract_patch(
    sb: Sandbox, base_commit: str, *, workdir: str = "/testbed", attempts: int = 3
) -> PatchResult:
    """``git add -A && git diff --cached --binary <base>`` in ``workdir``, retried on SandboxError.

    The diff goes through a file (``read_file``), not stdout, so a large patch is never cut to the
    command output tail. Never raises for provider faults: after ``attempts`` tries the result has
    failure_reason patch_extraction_failed.
    """
    wd, base = shlex.quote(workdir), shlex.quote(base_commit)
    cmd = (
        f"mkdir -p /tmp/.sweflow && cd {wd} && git add -A && "
        f"git -c core.quotepath=true diff --cached --binary {base} > {PATCH_FILE}"
    )

    def once() -> str:
        r = sb.run(cmd, timeout=120)
        if not r.ok:
            raise EvalError(
                f"git diff failed (exit {r.exit_code}): {(r.stderr or r.stdout).strip()[-300:]}",
                row=getattr(sb, "id", None),
                field="base_commit",
            )
        return _decode(sb.read_file(PATCH_FILE))

    try:
        patch = retry(once, attempts=attempts, backoff=1.0, retry_on=(SandboxError,), what="extract_patch")
    except (SandboxError, EvalError) as exc:
        return PatchResult("", PATCH_EXTRACTION_FAILED, [], f"{type(exc).__name__}: {exc}")
    reason, tests = check_patch(patch)
    return PatchResult(patch, reason, tests)


# ----- fresh evaluation ---------------------------------------------------------------------------------
@dataclass
class EvalResult:
    """The verdict of one fresh evaluation.

    ``reward`` is 1.0 only if the marker says resolved. ``failure_reason``: None when resolved, else a
    harness reason (fail_to_pass_failure, log_contradicts_exit_code, ...), a reward reason
    (missing_reward_marker, malformed_reward_marker) or an evaluation reason (failed_apply_patch,
    fresh_eval_exception, fresh_eval_timeout). ``marker`` is the marker payload, ``output_tail`` the
    bounded end of the evaluator's output, ``timings`` seconds per phase, ``error`` "Type: message" for
    provider faults.
    """

    reward: float
    resolved: bool
    failure_reason: str | None
    marker: dict | None = None
    output_tail: str = ""
    timings: dict = field(default_factory=dict)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluator_step(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The after-agent ``harness_eval`` command entry of a training row's metadata (the first if unnamed)."""
    steps = list((metadata.get("blackbox_execute_cmds") or {}).get("after_agent") or [])
    named = [s for s in steps if s.get("name") == "harness_eval"]
    step = (named or steps or [None])[0]
    if not step or not step.get("cmd"):
        raise EvalError(
            "row has no after-agent evaluator command",
            row=metadata.get("instance_id"),
            field="blackbox_execute_cmds.after_agent",
        )
    return step


def _bounded(text: str, limit: int = OUTPUT_TAIL_CHARS) -> str:
    return text if len(text) <= limit else text[-limit:]


def _result(reason: str, timings: dict, *, tail: str = "", error: str | None = None) -> EvalResult:
    return EvalResult(0.0, False, reason, None, _bounded(tail), timings, error)


def evaluate_patch(
    provider: Provider,
    template: str,
    metadata: dict,
    patch: str,
    *,
    poll_interval: float = 15.0,
    deadline: float | None = None,
    sandbox_timeout: float = 3600,
    env: dict | None = None,
) -> EvalResult:
    """Apply ``patch`` in a fresh sandbox of ``template`` and run the row's evaluator; never raises for faults.

    Steps: create; ``git reset --hard <base> && git clean -fd``; ``git apply --binary`` (skipped for an
    empty patch, which grades the base itself); start the evaluator in the background and poll it, first
    every second then backing off to ``poll_interval``. ``deadline`` is an absolute ``time.monotonic()``
    instant (default: now + the evaluator step's timeout + 120 s); past it the command is killed and the
    result is fresh_eval_timeout. The sandbox is always killed. A row without an evaluator command raises
    EvalError (a caller bug, not a rollout outcome).
    """
    step = evaluator_step(metadata)
    marker = metadata.get("reward_marker") or DEFAULT_REWARD_MARKER
    workdir = metadata.get("workdir") or "/testbed"
    base = metadata["base_commit"]
    t0 = time.monotonic()
    if deadline is None:
        deadline = t0 + float(step.get("timeout") or 1260) + DEADLINE_GRACE
    timings: dict[str, float] = {}
    sb: Sandbox | None = None
    try:
        sb = provider.create(
            template,
            timeout=sandbox_timeout,
            env=env,
            metadata={"purpose": "fresh_eval", "instance_id": str(metadata.get("instance_id", ""))},
        )
        timings["create_s"] = round(time.monotonic() - t0, 3)
        t1 = time.monotonic()
        failed = _prepare(sb, workdir, base, patch)
        timings["setup_s"] = round(time.monotonic() - t1, 3)
        if failed is not None:
            return _result(FAILED_APPLY_PATCH, timings, tail=failed)
        t2 = time.monotonic()
        res = _run_polled(sb, step["cmd"], workdir, poll_interval, deadline)
        timings["eval_s"] = round(time.monotonic() - t2, 3)
        if res is None:
            return _result(FRESH_EVAL_TIMEOUT, timings, error="the evaluator passed the fresh-eval deadline")
        tail = _bounded(res.stdout + ("\n" + res.stderr if res.stderr else ""))
        payload = parse_marker(res.stdout, marker)
        rr = reward_from_payload(payload)
        return EvalResult(rr.reward, rr.resolved, rr.failure_reason, payload, tail, timings, None)
    except Exception as exc:  # noqa: BLE001 - every fault becomes a graded outcome for the dispatcher
        log.warning(
            "fresh evaluation of %s failed: %s: %s", metadata.get("instance_id"), type(exc).__name__, exc
        )
        return _result(FRESH_EVAL_EXCEPTION, timings, error=f"{type(exc).__name__}: {exc}")
    finally:
        if sb is not None:
            t3 = time.monotonic()
            try:
                sb.kill()
            except Exception as exc:  # noqa: BLE001 - the verdict stands; the leak is logged
                log.warning("killing sandbox %s failed: %s", getattr(sb, "id", "?"), exc)
            timings["kill_s"] = round(time.monotonic() - t3, 3)
        timings["total_s"] = round(time.monotonic() - t0, 3)


def _prepare(sb: Sandbox, workdir: str, base: str, patch: str) -> str | None:
    """Reset the fresh sandbox to the base and apply the patch; the apply error text, or None on success."""
    wd, b = shlex.quote(workdir), shlex.quote(base)
    r = sb.run(f"cd {wd} && git reset -q --hard {b} && git clean -fdq", timeout=SETUP_TIMEOUT)
    if not r.ok:
        raise SandboxError(
            f"resetting {workdir} to {base} failed (exit {r.exit_code}): {(r.stderr or r.stdout).strip()[-300:]}",
            file=sb.template,
            row=sb.id,
        )
    if not patch.strip():
        return None
    sb.write_file(PATCH_FILE, _encode(patch))
    r = sb.run(f"cd {wd} && git apply --binary --whitespace=nowarn {PATCH_FILE}", timeout=SETUP_TIMEOUT)
    if r.ok:
        return None
    return f"git apply failed (exit {r.exit_code}): {(r.stderr + r.stdout).strip()}"


def _run_polled(sb: Sandbox, cmd: str, workdir: str, poll_interval: float, deadline: float):
    """Start ``cmd`` in the background and poll it until it ends (its CommandResult) or the deadline (None)."""
    bg = sb.start(cmd, cwd=workdir)
    wait, errors = min(1.0, poll_interval), 0
    while True:
        now = time.monotonic()
        if now >= deadline:
            try:
                bg.kill()
            except Exception:  # noqa: BLE001 - the sandbox is killed next anyway
                pass
            return None
        time.sleep(max(0.0, min(wait, deadline - now)))
        try:
            res = bg.poll()
            errors = 0
        except SandboxError:
            errors += 1  # a transient provider hiccup; the command keeps running in the sandbox
            if errors >= MAX_POLL_ERRORS:
                raise
            continue
        if res is not None:
            return res
        wait = min(poll_interval, wait * 2)
