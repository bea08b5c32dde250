"""sweflow.progress: plain lines with counts and an ETA in logs, a tqdm bar on a terminal."""

from __future__ import annotations

import io
import logging

from sweflow.progress import Progress, format_seconds, item_log


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_count_and_estimate_what_is_left():
    out, clock = io.StringIO(), Clock()
    p = Progress(4, "convert train", stream=out, clock=clock)
    assert p.eta() is None
    for i, item in enumerate(["a", "b", "c", "d"], 1):
        clock.t += 2.0
        p.update(item=item, ok=item != "c")
        if i == 2:
            assert p.eta() == 4.0  # 2 s per item so far, 2 items left
    lines = out.getvalue().splitlines()
    assert lines[0] == "convert train: 1/4 (25.0%) a; 2.0 s elapsed, ETA 6.0 s"
    assert lines[2] == "convert train: 3/4 (75.0%) c, 1 with problems; 6.0 s elapsed, ETA 2.0 s"
    assert lines[3].startswith("convert train: 4/4 (100.0%) d, 1 with problems; 8.0 s elapsed, ETA 0.0 s")
    assert p.problems == 1 and len(lines) == 4


def test_every_n_items_keeps_the_first_the_last_and_every_problem():
    out = io.StringIO()
    p = Progress(10, "verify", stream=out, every=4, clock=Clock())
    for i in range(10):
        p.update(item=f"f{i}", ok=i != 5)
    counts = [ln.split(":")[1].split()[0] for ln in out.getvalue().splitlines()]
    assert counts == ["1/10", "4/10", "6/10", "8/10", "10/10"]


def test_item_log_writes_into_the_rule_log(caplog):
    logger = logging.getLogger("sweflow.test.progress")
    with caplog.at_level(logging.INFO, logger=logger.name):
        with item_log(2, "validate", logger) as p:
            p.update(item="x")
            p.update(item="y", note="kept")
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 2 and msgs[1].startswith("validate: 2/2 (100.0%) y kept;")


def test_a_terminal_gets_a_bar_not_lines():
    out = Tty()
    with Progress(3, "report", stream=out, unit="section") as p:
        for s in ("data", "training", "provenance"):
            p.update(item=s)
    text = out.getvalue()
    assert "\r" in text and "3/3" in text and "report" in text
    assert "ETA" not in text  # tqdm's own bar, not the log lines


def test_format_seconds():
    assert [format_seconds(s) for s in (3.14, 65, 3725)] == ["3.1 s", "1 m 05 s", "1 h 02 m"]
