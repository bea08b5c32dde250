"""What every workflow step does around its library call: logging, timing, provenance, one-line errors.

Plain data in (the rule's name, files, params), so it is usable and testable without Snakemake.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import SweflowError
from .util import setup_logging

log = logging.getLogger("sweflow.rule")


def _plain(obj: Any) -> Any:
    """Snakemake's Namedlist/Wildcards/Params -> plain dicts/lists/str."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if hasattr(obj, "_names") and hasattr(obj, "items"):  # snakemake Namedlist
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


@contextlib.contextmanager
def step(
    rule: str,
    *,
    outputs: Sequence[str],
    inputs: Sequence[str] | Mapping[str, Any] = (),
    params: Mapping[str, Any] | None = None,
    wildcards: Mapping[str, Any] | None = None,
    log_file: str | None = None,
    code: Sequence[str] = (),
    dataset: dict[str, Any] | None = None,
    provenance: bool = True,
    operational: Mapping[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """Run one rule's work: set up redacting logging, time it, write provenance for `outputs` on success.

    A SweflowError becomes a one-line message (in the log and on stderr) and exit status 1; the caller's
    outputs are written atomically by the library, so nothing partial is left. The yielded dict may receive
    `dataset` (the dataset root) or `extra` from the body before the records are written.
    """
    setup_logging(log_file)
    ctx: dict[str, Any] = {"dataset": dataset, "extra": None}
    started = time.time()
    log.info("rule %s started: %s", rule, dict(_plain(wildcards or {})))
    try:
        yield ctx
    except SweflowError as exc:
        log.error("%s", exc.one_line())
        print(f"sweflow: {exc.one_line()}", file=sys.stderr)
        logging.shutdown()
        sys.exit(1)
    except Exception:  # a bug: keep the traceback, but never a secret it quotes (a URL with credentials)
        import traceback

        from .util import redact

        text = redact(traceback.format_exc())
        log.error("%s", text.rstrip())
        print(text, file=sys.stderr, end="")
        logging.shutdown()
        sys.exit(1)
    ended = time.time()
    log.info("rule %s finished in %.2fs", rule, ended - started)
    if provenance:
        from .provenance import write_records

        input_list: Any = _plain(inputs)
        if isinstance(input_list, dict):
            flat: list[str] = []
            for v in input_list.values():
                flat.extend(v if isinstance(v, list) else [v])
            input_list = flat
        write_records(
            [str(o) for o in _plain(list(outputs))],
            rule=rule,
            wildcards=_plain(wildcards or {}),
            params=_plain(params or {}),
            inputs=[str(i) for i in input_list],
            code=[str(c) for c in code],
            log=[log_file] if log_file else [],
            dataset=ctx.get("dataset"),
            started=started,
            ended=ended,
            extra=ctx.get("extra"),
            operational=_plain(operational or {}),
        )


def from_snakemake(smk: Any, script_file: str, **kw: Any) -> contextlib.AbstractContextManager:
    """Unpack a Snakemake `script:` object into `step(...)`; the provenance records the config's
    operational values (config/keys.yaml), which params leave out."""
    from .params import operational_values

    config = getattr(smk, "config", None)
    kw.setdefault("operational", operational_values(dict(config), "") if config else None)
    return step(
        smk.rule,
        outputs=list(smk.output),
        inputs=list(smk.input),
        params={k: v for k, v in smk.params.items()},
        wildcards={k: v for k, v in smk.wildcards.items()},
        log_file=smk.log[0] if len(smk.log) else None,
        code=[script_file],
        **kw,
    )


def live(smk: Any, path: str) -> Any:
    """The config section at dotted `path` as the job sees it: result and operational values, secrets
    included (params hold only the result values, redacted; sweflow.params)."""
    from .params import section

    return section(smk.config, path)


# Where Snakemake's scheduler makes its re-evaluation timers (snakemake 9: JobScheduler._schedule_reevalutation)
SCHEDULER_SOURCE = "snakemake/scheduling/job_scheduler.py"


def cancel_scheduler_timers(source: str = SCHEDULER_SOURCE) -> int:
    """Cancel the scheduler's pending re-evaluation timers once the run is over; returns how many.

    Snakemake's job rate limiter (``--max-jobs-per-timespan``, 100/1s by default) starts a non-daemon
    ``threading.Timer`` of one timespan after each scheduling pass, and the interpreter waits for it at exit:
    about a second added to every run that ran a job. Called from ``onsuccess``/``onerror``, when no job is
    left to schedule; other timers are left alone."""
    n = 0
    for thread in threading.enumerate():
        code = getattr(getattr(thread, "function", None), "__code__", None)
        if isinstance(thread, threading.Timer) and code is not None:
            if code.co_filename.replace("\\", "/").endswith(source):
                thread.cancel()
                n += 1
    if n:
        log.debug("cancelled %d scheduler timer(s)", n)
    return n


# ----- a stage that made nothing usable ends the run (config `allow_empty` says when that is expected) -----
# What to do about the most common reason, by its words; the first match wins.
_MISSING_IMAGE = re.compile(
    r"(?<!template )image not found|no such image|pull access denied|manifest unknown|repository does not exist",
    re.I,
)


def empty_allowed(allow_empty: bool | Sequence[str] | None, stage: str) -> bool:
    """Whether the config's `allow_empty` (true, or a list of stage names) lets `stage` end empty."""
    if isinstance(allow_empty, bool) or allow_empty is None:
        return bool(allow_empty)
    return stage in allow_empty


def what_to_do(reason: str, *, images: Sequence[str] = (), listing: str | None = None) -> str:
    """The one thing to do about a reason: pull a missing image, fix the harness, or read the log."""
    if _MISSING_IMAGE.search(reason):
        cmd = f"docker pull {images[0]}" if images else "docker pull <image>"
        every = f"; all of them: xargs -n1 docker pull < {listing}" if listing else ""
        return f"pull the images: {cmd}{every}"
    if reason.startswith("harness:"):
        return "check harness.package and harness.extra_repos"
    return "see the rule's log for each item's reason"


def check_not_empty(
    stage: str,
    *,
    kept: int,
    total: int,
    what: str,
    reasons: Sequence[tuple[str, str]],
    allow_empty: bool | Sequence[str] | None,
    listing: str | None = None,
) -> None:
    """Raise EmptyResultError when `stage` kept none of its `total` items (`what`: "rows converted"), unless
    `allow_empty` names it. `reasons`: (item, reason) of each item left out; the item (an image name) is cut
    out of its reason so that one reason counts once. Call it before writing the stage's outputs."""
    from collections import Counter

    from .errors import EmptyResultError

    if kept or empty_allowed(allow_empty, stage):
        return
    counts = Counter(" ".join(r.replace(item, "<image>").split()) if item else r for item, r in reasons)
    reason, why = "", "; the stage before it passed on nothing"
    if counts:
        reason, n = counts.most_common(1)[0]
        why = f"; most common reason ({n} of {total}): {reason}"
    images = [item for item, r in reasons if item and _MISSING_IMAGE.search(r)]
    hint = what_to_do(reason, images=images, listing=listing) if reason else "check the stage before it"
    raise EmptyResultError(
        f"{stage}: 0 of {total} {what}{why}",
        hint=f"{hint}; or, if that is expected, set allow_empty: [{stage}]",
    )
