"""Socket helpers shared by the blackbox server and the proxy (standard library only: ships in sandboxes)."""

from __future__ import annotations

import socket
import time

# After refusing a request whose body was not read, drain what the client already sent for this long, so
# closing the socket does not reset the connection before the client has read our answer.
LINGER_S = 0.5
LINGER_BYTES = 1 << 20


def linger(connection: socket.socket) -> None:
    """Half-close, then discard what the client still sends for a moment (at most LINGER_BYTES)."""
    try:
        connection.shutdown(socket.SHUT_WR)
        connection.settimeout(LINGER_S)
        deadline, got = time.monotonic() + LINGER_S, 0
        while got < LINGER_BYTES and time.monotonic() < deadline:
            chunk = connection.recv(65536)
            if not chunk:
                break
            got += len(chunk)
    except OSError:
        pass
