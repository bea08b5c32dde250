"""The in-sandbox agent runtime: the blackbox server (port 31000) that runs Claude Code inside a sandbox.

`server`/`sessions` serve the session API, `claude_options` turns backend options into the CLI's argv and
env, `claude_code` runs its turns. Start it with `python -m sweflow.blackbox --host 0.0.0.0 --port 31000`.
Standard library only: it runs from an isolated runtime that has nothing but the sweflow wheel.
"""

from .claude_code import ClaudeCodeAgent
from .claude_options import ClaudeCodeOptions, build_argv, build_env
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
