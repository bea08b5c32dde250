"""`python -m sweflow.blackbox --host 0.0.0.0 --port 31000`: serve until interrupted.

The token every route but /health demands comes from $SWEFLOW_BLACKBOX_TOKEN, the file named by
$SWEFLOW_BLACKBOX_TOKEN_FILE, or /run/sweflow/blackbox.token (see sweflow.blackbox.server).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from .. import __version__
from .server import DEFAULT_RUNTIME_DIR, BlackboxServer

PORT_ENV = "SWEFLOW_BLACKBOX_PORT"


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _not_dumpable() -> None:
    """Make /proc/<pid>/environ and /proc/<pid>/mem of this process unreadable to same-uid processes (the
    agent): the token stays in the initial environment block even after os.environ forgets it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0; children are dumpable again after execve
    except (OSError, AttributeError):
        pass  # not Linux: nothing to harden


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweflow.blackbox", description=__doc__)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=int(os.environ.get(PORT_ENV) or 31000))
    parser.add_argument(
        "--runtime-dir", default=os.environ.get("SWEFLOW_BLACKBOX_RUNTIME_DIR") or DEFAULT_RUNTIME_DIR
    )
    parser.add_argument("--max-sessions", type=int, default=1)
    parser.add_argument(
        "--claude-bin", default=None, help="Claude Code executable (default: $SWEFLOW_CLAUDE_BIN, PATH)"
    )
    parser.add_argument("--turn-timeout", type=float, default=3600.0, help="default seconds per agent turn")
    parser.add_argument(
        "--workdir", default=None, help="default working directory (default: the current one)"
    )
    parser.add_argument("--version", action="version", version=__version__)
    args = parser.parse_args(argv)
    _not_dumpable()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = BlackboxServer(
        args.host,
        args.port,
        runtime_dir=args.runtime_dir,
        max_sessions=args.max_sessions,
        agent_binary=args.claude_bin,
        default_turn_timeout=args.turn_timeout,
        default_workdir=args.workdir,
    )
    # SIGTERM (docker stop, sandbox kill) should reap agent process groups like Ctrl-C does.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    logging.getLogger("sweflow.blackbox").info(
        "blackbox %s listening on %s:%d", __version__, args.host, server.httpd.server_address[1]
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
