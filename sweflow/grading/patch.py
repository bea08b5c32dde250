"""The agent's change: extracted from its sandbox as a binary git diff, then checked.

`extract_patch` never raises (provider faults are patch_extraction_failed, a failing command in a live
sandbox patch_unextractable); `check_patch` applies the integrity rules of ``patch_integrity``.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import EvalError, SandboxError
from ..sandbox.base import Sandbox
from ..util import retry
from . import fresh
from .integrity import DEFAULT_RULES, IntegrityRules
from .patch_integrity import PATCH_TOO_LARGE, check_patch_integrity
from .reasons import EMPTY_GENERATION, PATCH_EXTRACTION_FAILED, PATCH_UNEXTRACTABLE

PINNED_DIFF, UNHOOKED = fresh.PINNED_DIFF, fresh.UNHOOKED


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


_decode = fresh.decode


def check_patch(
    patch: str,
    metadata: Mapping[str, Any] | None = None,
    *,
    eval_script: str | None = None,
    rules: IntegrityRules = DEFAULT_RULES,
) -> tuple[str | None, list[str]]:
    """(failure_reason, offending paths) of a patch: empty_generation, one of the integrity reasons of
    ``sweflow.grading.patch_integrity`` (prohibited_test_modification first), or (None, [])."""
    if not patch.strip():
        return EMPTY_GENERATION, []
    found = check_patch_integrity(patch, metadata=metadata, eval_script=eval_script, rules=rules)
    if not found:
        return None, []
    reason = found[0].reason
    return reason, sorted({v.path for v in found if v.reason == reason})


def extract_patch(
    sb: Sandbox,
    base_commit: str,
    *,
    workdir: str = "/testbed",
    attempts: int = 3,
    rules: IntegrityRules = DEFAULT_RULES,
) -> PatchResult:
    """``git add -A && git diff --cached --binary <base>`` in ``workdir``, retried on SandboxError.

    The diff goes through a file (``read_file``), not stdout, so a large patch is never cut to the
    command output tail; one over ``rules.max_patch_bytes`` is never read (patch_too_large). Never raises:
    provider faults, after ``attempts`` tries, are patch_extraction_failed (infrastructure); the command
    failing in a live sandbox is patch_unextractable (the agent's doing: graded 0).
    """
    wd, base = shlex.quote(workdir), shlex.quote(base_commit)
    # The agent controls this repository's .git: its config (diff prefixes, external diff, textconv) and
    # its index (a stale index.lock) must not shape the diff. A private index and pinned options do that;
    # what the diff SHOWS is re-checked in the fresh sandbox anyway (see _fresh_diff).
    # A folder of its own, named at random: the agent cannot block it in advance (``touch /tmp/.sweflow``).
    work = f"/tmp/.sweflow-extract-{uuid.uuid4().hex}"
    index, out = f"{work}/index", f"{work}/patch.diff"
    cmd = (
        f"mkdir -m 700 {work} && cd {wd} && export GIT_INDEX_FILE={index} && git {UNHOOKED} add -A && "
        f"git {PINNED_DIFF} --cached --binary {base} > {out}; rc=$?; rm -f {index}; "
        f'[ $rc -eq 0 ] && printf "\\n%s\\n" "$(wc -c < {out})"; exit $rc'
    )
    cap = rules.max_patch_bytes

    def once() -> str | None:
        r = sb.run(cmd, timeout=120)
        if not r.ok:
            raise EvalError(
                f"git diff failed (exit {r.exit_code}{', timed out' if r.timed_out else ''}): "
                f"{(r.stderr or r.stdout).strip()[-300:]}",
                row=getattr(sb, "id", None),
                field="base_commit",
            )
        size = (r.stdout.strip().splitlines() or [""])[-1].strip()
        if not size.isdigit():
            raise EvalError(f"git diff wrote no size: {r.stdout.strip()[-200:]!r}", field="base_commit")
        if int(size) > cap:
            return None
        data = sb.read_file(out)
        return None if len(data) > cap else _decode(data)

    try:
        patch = retry(once, attempts=attempts, backoff=1.0, retry_on=(SandboxError,), what="extract_patch")
    except SandboxError as exc:
        return PatchResult("", PATCH_EXTRACTION_FAILED, [], f"{type(exc).__name__}: {exc}")
    except EvalError as exc:
        # The command ran in a live sandbox and failed: the agent's tree or .git did that (a broken
        # repository, a hung file, a blocked path); the caller grades it 0 unless the sandbox is gone.
        return PatchResult("", PATCH_UNEXTRACTABLE, [], f"{type(exc).__name__}: {exc}")
    if patch is None:
        return PatchResult("", PATCH_TOO_LARGE, [], f"the patch is over the cap of {cap} bytes")
    reason, tests = check_patch(patch, rules=rules)
    return PatchResult(patch, reason, tests)
