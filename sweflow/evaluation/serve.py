"""A vLLM server for one checkpoint's evaluation (`evaluate.engine: vllm`): started beside the job, asked
until ready, stopped with its process group; the proxy's VLLMEngine talks to it token-in/token-out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import EvalError

log = logging.getLogger("sweflow.evaluate")


def vllm_command(
    model_dir: str | os.PathLike, *, name: str, seed: int, options: Mapping[str, Any]
) -> list[str]:
    """vLLM's OpenAI server for `model_dir` under `name` on 127.0.0.1 (`options`: evaluate.vllm, its port)."""
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", name, "--host", "127.0.0.1", "--port", str(int(options["port"])), "--seed", str(int(seed)),
        "--gpu-memory-utilization", str(options["gpu_memory_utilization"]),
        "--tensor-parallel-size", str(int(options["tensor_parallel_size"])),
    ]  # fmt: skip
    if options.get("max_model_len"):
        cmd += ["--max-model-len", str(int(options["max_model_len"]))]
    return cmd + [str(a) for a in options.get("extra_args") or []]


def _ready(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@contextlib.contextmanager
def served(
    command: Sequence[str],
    base_url: str,
    *,
    log_path: str | os.PathLike,
    startup_timeout: float,
    poll: float = 1.0,
) -> Iterator[str]:
    """Run `command` (a server answering GET /health at `base_url`) until the block ends; yields `base_url`
    once it is ready. Its output goes to `log_path`. A server that exits or is not ready within
    `startup_timeout` seconds raises EvalError with the end of its log; the whole process group is stopped
    (TERM, then KILL after 30 s) whatever happens."""
    path = Path(log_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as out:
        proc = subprocess.Popen(list(command), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + startup_timeout
        while not _ready(base_url):
            if proc.poll() is not None:
                raise EvalError(
                    f"the model server exited with status {proc.returncode} before it was ready:\n{_tail(path)}",
                    file=str(path), field="evaluate.vllm",
                    hint="see the server log; on a GPU node, check gpu_memory_utilization and the model's size",
                )  # fmt: skip
            if time.monotonic() > deadline:
                raise EvalError(
                    f"the model server was not ready within {startup_timeout:g} s:\n{_tail(path)}",
                    file=str(path), field="evaluate.vllm.startup_timeout_sec",
                    hint="raise evaluate.vllm.startup_timeout_sec for a large checkpoint",
                )  # fmt: skip
            time.sleep(poll)
        log.info("model server ready at %s (pid %d)", base_url, proc.pid)
        yield base_url
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
