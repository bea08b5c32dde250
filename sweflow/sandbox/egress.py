"""Host side of a network-less sandbox's two routes, through its socket folder (bound at /run/sweflow inside).

- in:  host 127.0.0.1:<free port>  ->  <folder>/blackbox.sock  (an in-sandbox forwarder pipes it to :31000)
- out: <folder>/egress.sock        ->  the one egress host:port (an in-sandbox forwarder listens on loopback)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..blackbox.forward import Forwarder
from ..errors import SandboxError

SOCKET_DIR = "/run/sweflow"  # where the socket folder appears inside a sandbox
BLACKBOX_SOCK = "blackbox.sock"
EGRESS_SOCK = "egress.sock"
# Created by the in-sandbox forwarders once they listen (see Routes.wait_ready).
EGRESS_READY = "egress.ready"
BLACKBOX_READY = "blackbox.ready"


def split_egress(egress: str) -> tuple[str, int]:
    """'host:port' -> (host, port); raises SandboxError naming the bad value."""
    host, _, port = egress.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SandboxError(f"bad egress {egress!r}", field="egress", hint="host:port, e.g. 127.0.0.1:8000")
    return host.strip("[]"), int(port)


def inside_egress_port(egress: str, reserved: int) -> int:
    """The loopback port at which the egress appears inside: its own port, unless that one is taken."""
    port = split_egress(egress)[1]
    return port if port != reserved else port + 1


# The byte pumping is `sweflow.blackbox.forward.Forwarder`, the same code that runs inside the sandbox.
class Routes:
    """The host-side forwarders of one sandbox; `close()` tears both down (idempotent)."""

    def __init__(self, folder: str | Path, *, egress: str | None, blackbox: bool = True) -> None:
        self.folder = Path(folder)
        self.egress: Forwarder | None = None
        self.blackbox: Forwarder | None = None
        # Unix socket paths are limited to 108 bytes; reach the folder through a short /proc/self/fd path.
        self._dirfd: int | None = os.open(self.folder, os.O_PATH | os.O_DIRECTORY)
        short = f"/proc/self/fd/{self._dirfd}"
        try:
            if egress:
                host, port = split_egress(egress)
                # 0666: the sandbox user (not root) must be able to connect; the folder itself is private.
                self.egress = Forwarder(
                    f"unix:{short}/{EGRESS_SOCK}", f"tcp:{host}:{port}", mode=0o666
                ).start()
            if blackbox:
                self.blackbox = Forwarder("tcp:127.0.0.1:0", f"unix:{short}/{BLACKBOX_SOCK}").start()
        except OSError as exc:
            self.close()
            raise SandboxError(f"cannot set up the sandbox routes: {exc}", file=str(self.folder)) from exc

    @property
    def blackbox_port(self) -> int | None:
        return self.blackbox.address[1] if self.blackbox else None

    def wait_ready(self, timeout: float = 30.0, *, alive=None) -> None:
        """Block until the in-sandbox forwarders listen, so the first command of a fresh sandbox can
        already reach `egress_url` (and their pids exist to be spared by leftover kills). ``alive`` (a
        callable) stops the wait early when the sandbox died; SandboxError after `timeout`."""
        wanted = [EGRESS_READY] * (self.egress is not None) + [BLACKBOX_READY] * (self.blackbox is not None)
        deadline = time.monotonic() + timeout
        while not all((self.folder / name).exists() for name in wanted):
            dead = alive is not None and not alive()
            if dead or time.monotonic() >= deadline:
                raise SandboxError(
                    "the in-sandbox forwarders did not start: "
                    + ("the sandbox's holder exited" if dead else f"not listening after {timeout:.0f}s"),
                    file=str(self.folder),
                    hint="does the template carry the runtime (/opt/sweflow/runtime)?",
                )
            time.sleep(0.02)

    def lock(self, owner: int) -> None:
        """Once the forwarders listen: give the folder to `owner` (a uid that is NOT the sandbox's) with
        mode 0555, so sandbox processes can still connect but can never unlink a socket and bind their
        own in its place (which would put the agent on the host's side of its blackbox route)."""
        os.chown(self.folder, owner, owner)
        os.chmod(self.folder, 0o555)

    def close(self) -> None:
        for fwd in (self.egress, self.blackbox):
            if fwd is not None:
                fwd.close()
        if self._dirfd is not None:
            os.close(self._dirfd)
            self._dirfd = None


def inside_forwarders(python: str, *, egress_port: int | None, blackbox_port: int | None) -> str:
    """Shell lines (background jobs) that start the in-sandbox forwarders with `python`."""
    # env -u: the forwarders never hold the blackbox token (it is meant for the server alone).
    fwd = f"env -u SWEFLOW_BLACKBOX_TOKEN {python} -m sweflow.blackbox.forward"
    lines = []
    if blackbox_port:
        lines.append(
            f"{fwd} --listen unix:{SOCKET_DIR}/{BLACKBOX_SOCK} --connect tcp:127.0.0.1:{blackbox_port}"
            f" --ready {SOCKET_DIR}/{BLACKBOX_READY} &"
        )
    if egress_port:
        lines.append(
            f"{fwd} --listen tcp:127.0.0.1:{egress_port} --connect unix:{SOCKET_DIR}/{EGRESS_SOCK}"
            f" --ready {SOCKET_DIR}/{EGRESS_READY} &"
        )
    return "\n".join(lines)
