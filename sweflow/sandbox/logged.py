"""The host end of `Sandbox.run_logged`: a capped, append-only log file fed from a pipe or stream chunks."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

TRUNCATED_NOTE = b"\n[sweflow: log truncated: output past the byte limit was dropped]\n"


class LogSink:
    """Appends a pipe's bytes to a host file, at most `max_bytes` of them, then one truncation note."""

    def __init__(self, path: str | os.PathLike, max_bytes: int) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(path, "ab")  # noqa: SIM115 - closed in close()
        self.left = max_bytes
        self.cut = False
        self.lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self.lock:
            if self.fh is None or self.cut:
                return
            if len(data) > self.left:
                self.fh.write(data[: self.left])
                self.fh.write(TRUNCATED_NOTE)
                self.cut = True
                self.left = 0
            else:
                self.fh.write(data)
                self.left -= len(data)
            self.fh.flush()

    def drain(self, pipe: Any) -> None:
        fd = pipe.fileno()
        try:
            while chunk := os.read(fd, 65536):
                self.write(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                pipe.close()

    def close(self) -> None:
        with self.lock:
            if self.fh is not None:
                self.fh.close()
                self.fh = None
