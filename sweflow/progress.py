"""Progress of long work: a progress bar on a terminal, plain lines with counts and an ETA elsewhere.

`Progress(total, label)` counts items: a tqdm bar on a terminal, else one plain line per item (or per
`every` items) through a logger or to the stream. Rules use `item_log(total, label, logger)` (plain lines
into the rule's log, one per item).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, TextIO


def format_seconds(sec: float) -> str:
    """3.1 s, 4 m 05 s, 2 h 03 m: short enough for a log line."""
    if sec < 60:
        return f"{sec:.1f} s"
    if sec < 3600:
        m, s = divmod(int(round(sec)), 60)
        return f"{m} m {s:02d} s"
    h, rest = divmod(int(round(sec)), 3600)
    return f"{h} h {rest // 60:02d} m"


# `Progress(total, label)` counts items. On a terminal (the stream is a tty) it draws a tqdm bar; otherwise (a
# rule's log file, a pipe, CI) it writes one plain line per item, or per `every` items, through a logger or to
# the stream:
#
#     convert train: 120/2438 (4.9%) sweflow__calclib-120 ok; 3.1 s elapsed, ETA 59.9 s
class Progress:
    """Counts `total` items of one piece of work; `update()` after each item, `close()` (or `with`) at the end.

    stream: where a bar or plain lines go (default stderr); logger: plain lines go there instead (a rule's
    log); bar: force (True) or forbid (False) the tqdm bar, default: only on a terminal; every: a plain line
    every N items (the first and the last item always get one); clock: injectable for tests."""

    def __init__(
        self,
        total: int,
        label: str,
        *,
        stream: TextIO | None = None,
        logger: logging.Logger | None = None,
        bar: bool | None = None,
        every: int = 1,
        unit: str = "item",
        clock: Any = time.monotonic,
    ) -> None:
        self.total, self.label, self.unit = max(int(total), 0), label, unit
        self.stream = stream if stream is not None else sys.stderr
        self.logger, self.every, self.clock = logger, max(int(every), 1), clock
        self.done, self.problems = 0, 0
        self.started = clock()
        self._lock = threading.Lock()  # worker threads may count their own items
        if bar is None:
            bar = logger is None and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._bar = None
        if bar:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total, desc=label, unit=unit, file=self.stream, leave=True, dynamic_ncols=True
            )

    # The ETA is the mean time per item so far times the items left; it is left out until one item is done.
    def eta(self) -> float | None:
        """Seconds left at the mean pace so far; None before the first item."""
        if not self.done:
            return None
        return (self.clock() - self.started) / self.done * max(self.total - self.done, 0)

    def line(self, item: str | None = None, note: str = "") -> str:
        """The plain line for the current count."""
        elapsed = self.clock() - self.started
        share = f" ({100 * self.done / self.total:.1f}%)" if self.total else ""
        what = "".join(f" {x}" for x in (item, note) if x)
        eta = self.eta()
        tail = f"; {format_seconds(elapsed)} elapsed" + (
            f", ETA {format_seconds(eta)}" if eta is not None else ""
        )
        bad = f", {self.problems} with problems" if self.problems else ""
        return f"{self.label}: {self.done}/{self.total}{share}{what}{bad}{tail}"

    def update(self, n: int = 1, *, item: str | None = None, ok: bool = True, note: str = "") -> None:
        """Count `n` more items done (`item` names the last one; `ok=False` counts it as a problem)."""
        with self._lock:
            self._update(n, item, ok, note)

    def _update(self, n: int, item: str | None, ok: bool, note: str) -> None:
        self.done += n
        self.problems += 0 if ok else n
        if self._bar is not None:
            self._bar.update(n)
            if item:
                self._bar.set_postfix_str(item if ok else f"PROBLEM {item}", refresh=False)
            return
        if self.done == n or self.done >= self.total or self.done % self.every == 0 or not ok:
            self._emit(self.line(item, note))

    def _emit(self, text: str) -> None:
        if self.logger is not None:
            self.logger.info("%s", text)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def item_log(total: int, label: str, logger: logging.Logger, *, every: int = 1) -> Progress:
    """Plain per-item lines (counts, elapsed, ETA) into a rule's log through `logger`; never a bar."""
    return Progress(total, label, logger=logger, bar=False, every=every)
