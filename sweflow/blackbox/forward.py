"""A byte forwarder between TCP and Unix sockets: the only way in and out of a network-less sandbox.

`python -m sweflow.blackbox.forward --listen tcp:127.0.0.1:8080 --connect unix:/run/sweflow/egress.sock`
accepts on the first endpoint and pipes every connection, both ways, to a fresh connection to the second.
Standard library only (it runs on the task image's python).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading

# Sandboxes without a network route the host's calls to their blackbox server (unix -> tcp:127.0.0.1:31000)
# and their calls to the one allowed egress (tcp -> unix) through a socket folder the host shares with them.

CHUNK = 65536
CONNECT_TIMEOUT = 10.0


def parse_endpoint(spec: str) -> tuple[str, object]:
    """'tcp:HOST:PORT' -> ('tcp', (host, port)); 'unix:PATH' -> ('unix', path)."""
    kind, _, rest = spec.partition(":")
    if kind == "unix" and rest:
        return "unix", rest
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        if host and port.isdigit():
            return "tcp", (host.strip("[]"), int(port))
    raise ValueError(f"bad endpoint {spec!r}: want tcp:HOST:PORT or unix:PATH")


def _connect(endpoint: tuple[str, object]) -> socket.socket:
    kind, addr = endpoint
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        sock = socket.socket(socket.AF_INET6 if ":" in addr[0] else socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(addr)
    except OSError:
        sock.close()
        raise
    sock.settimeout(None)
    return sock


def _listen(endpoint: tuple[str, object], mode: int | None) -> socket.socket:
    kind, addr = endpoint
    if kind == "unix":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(addr)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(addr)
        if mode is not None:
            os.chmod(addr, mode)
    else:
        sock = socket.socket(socket.AF_INET6 if ":" in addr[0] else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    sock.listen(128)
    return sock


def _copy(src: socket.socket, dst: socket.socket) -> None:
    """Copy one direction until EOF or an error, then pass the half-close on."""
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _pump(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways (one thread per direction; no select(), so any fd number works)."""
    back = threading.Thread(target=_copy, args=(b, a), daemon=True)
    back.start()
    try:
        _copy(a, b)
        back.join()
    finally:
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.close()


# Two threads per connection, at most `max_conns` at once (more wait in the listen backlog); the host side
# reuses `Forwarder` itself.
class Forwarder:
    """Accept on `listen`, forward each connection to `connect`; `start()` serves in a thread, `close()` stops
    it and drops the live connections (and removes a Unix listening socket)."""

    def __init__(self, listen: str, connect: str, *, max_conns: int = 64, mode: int | None = None) -> None:
        self.listen_ep, self.connect_ep = parse_endpoint(listen), parse_endpoint(connect)
        self.sock = _listen(self.listen_ep, mode)
        self.slots = threading.BoundedSemaphore(max_conns)
        self.live: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.closed = False
        self.thread: threading.Thread | None = None

    @property
    def address(self) -> object:
        """The bound address: (host, port) for TCP (port 0 resolved), the path for Unix."""
        return self.sock.getsockname()

    def start(self) -> Forwarder:
        self.thread = threading.Thread(target=self.serve_forever, name="sweflow-forward", daemon=True)
        self.thread.start()
        return self

    def serve_forever(self) -> None:
        while not self.closed:
            self.slots.acquire()
            try:
                client, _ = self.sock.accept()
            except OSError:
                self.slots.release()
                if self.closed:
                    return
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = None
        try:
            try:
                upstream = _connect(self.connect_ep)
            except OSError:
                client.close()
                return
            with self.lock:
                if self.closed:
                    client.close()
                    upstream.close()
                    return
                self.live.update((client, upstream))
            _pump(client, upstream)
        finally:
            with self.lock:
                self.live.discard(client)
                if upstream is not None:
                    self.live.discard(upstream)
            self.slots.release()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            live, self.live = list(self.live), set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()
        for s in live:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
        if self.listen_ep[0] == "unix":
            with contextlib.suppress(OSError):
                os.unlink(self.listen_ep[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweflow.blackbox.forward", description=__doc__)
    parser.add_argument("--listen", required=True, help="tcp:HOST:PORT or unix:PATH")
    parser.add_argument("--connect", required=True, help="tcp:HOST:PORT or unix:PATH")
    parser.add_argument("--max-conns", type=int, default=64)
    parser.add_argument("--mode", type=lambda s: int(s, 8), default=None, help="octal mode of a Unix socket")
    parser.add_argument("--ready", default=None, help="a file to create once the listener accepts")
    args = parser.parse_args(argv)
    try:
        fwd = Forwarder(args.listen, args.connect, max_conns=args.max_conns, mode=args.mode)
        if args.ready:
            with open(args.ready, "w") as fh:
                fh.write(str(os.getpid()))
    except (OSError, ValueError) as exc:
        print(f"forward: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: fwd.close())
    try:
        fwd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        fwd.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
