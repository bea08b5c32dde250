"""rulekit.cancel_scheduler_timers: Snakemake's pending re-evaluation timers stop holding up the exit."""

from __future__ import annotations

import inspect
import threading
import time

from sweflow.rulekit import SCHEDULER_SOURCE, cancel_scheduler_timers


def _fn_from(filename: str, calls: list):
    """A callable whose code says it was defined in `filename` (as the scheduler's lambda is)."""
    return eval(compile("lambda: calls.append(1)", filename, "eval"), {"calls": calls})


def test_the_schedulers_timers_are_cancelled_and_others_kept():
    calls: list = []
    ours = threading.Timer(30, _fn_from(f"/venv/site-packages/{SCHEDULER_SOURCE}", calls))
    other = threading.Timer(30, _fn_from("/somewhere/else.py", calls))
    ours.start()
    other.start()
    try:
        t = time.monotonic()
        assert cancel_scheduler_timers() == 1
        ours.join(5)
        assert not ours.is_alive() and time.monotonic() - t < 5 and calls == []
        assert other.is_alive()  # not the scheduler's: left alone
    finally:
        other.cancel()
        other.join(5)


def test_nothing_to_cancel_is_fine():
    assert cancel_scheduler_timers(source="no/such/module.py") == 0


def test_snakemakes_scheduler_still_makes_its_timers_where_we_look():
    """If Snakemake moves or renames the timer, cancelling would silently do nothing: this says so."""
    from snakemake.scheduling import job_scheduler

    assert inspect.getsourcefile(job_scheduler).replace("\\", "/").endswith(SCHEDULER_SOURCE)
    src = inspect.getsource(job_scheduler.JobScheduler._schedule_reevalutation)
    assert "threading.Timer(" in src and ".start()" in src
