"""The in-sandbox blackbox server (port 31000) and its Claude Code adapter.

Start it with `python -m sweflow.blackbox --host 0.0.0.0 --port 31000`, or in-process with
`BlackboxServer(host, port, ...).start()`. Imports only the standard library: it runs from an isolated
runtime that has nothing but the sweflow wheel.
"""

from .claude_code import ClaudeCodeAgent, ClaudeCodeOptions, build_argv, build_env
from .server import BlackboxServer
from .sessions import ID_RE, ApiError, Session, SessionManager
from .stream import TurnOutcome, event_outputs, parse_line

__all__ = [
    "ID_RE",
    "ApiError",
    "BlackboxServer",
    "ClaudeCodeAgent",
    "ClaudeCodeOptions",
    "Session",
    "SessionManager",
    "TurnOutcome",
    "build_argv",
    "build_env",
    "event_outputs",
    "parse_line",
]
