"""The bubblewrap pieces that local sandboxes and their template builds share.

`_bwrap` is the setpriv + unprivileged bwrap argv (its namespaces, the read-only system); `check_unprivileged`
says once per uid whether the host allows it; `_searchable` and `_chown_tree` give bind sources the
permissions bwrap needs (it resolves them as the sandbox uid). The jail itself: `sweflow.sandbox.local`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import stat
from pathlib import Path

from ..errors import SandboxError
from ..util import log, run_cmd

# Host top-level entries a sandbox gets (read-only): the system, nothing of /work, /root, /var, /run, ...
_SYSTEM_DIRS = ("usr", "etc")
_SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def _system_binds() -> list[str]:
    """Read-only /usr and /etc, and /bin /lib ... as the host has them (symlinks or directories)."""
    args: list[str] = []
    for name in _SYSTEM_DIRS:
        args += ["--ro-bind", f"/{name}", f"/{name}"]
    for name in _SYSTEM_LINKS:
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", f"/{name}", f"/{name}"]
    return args


# What local sandboxes and template builds get whatever the host process's umask is (a site's 077 made the
# sandbox folder unsearchable for the sandbox uid, and the shared venvs unreadable): every folder the sandbox
# uid must reach gets an explicit mode, and every process started for a sandbox or a build this umask.
UMASK = 0o022


def _mkdir(path: Path, mode: int = 0o755, *, exist_ok: bool = False) -> Path:
    """mkdir (parents too) with ``mode`` exactly, not ``mode`` less this process's umask."""
    path.mkdir(parents=True, exist_ok=exist_ok)
    os.chmod(path, mode)
    return path


def _drop(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def _bwrap(uid: int, *, own_net: bool) -> list[str]:
    """setpriv + unprivileged bwrap with every namespace but (when `own_net` is False) the network."""
    args = _drop(uid) + ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    args += ["--unshare-cgroup-try"] + (["--unshare-net"] if own_net else [])
    args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox"]
    return args + _system_binds() + ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/var/tmp"]


@functools.lru_cache(maxsize=8)
def check_unprivileged(uid: int) -> None:
    """Raise SandboxError (one line) unless uid `uid` can start an unprivileged bwrap with its namespaces."""
    for tool, pkg in (("bwrap", "bubblewrap"), ("setpriv", "util-linux"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            raise SandboxError(f"{tool} is not installed", hint=f"apt-get install {pkg}")
    res = run_cmd(_bwrap(uid, own_net=True) + ["--", "/bin/true"], timeout=60, umask=UMASK)
    if res.returncode != 0:
        why = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        raise SandboxError(
            f"the kernel refuses unprivileged user namespaces for uid {uid} ({why}); the local sandbox needs them",
            hint="set user.max_user_namespaces > 0 (and kernel.unprivileged_userns_clone=1 or the AppArmor"
            " userns restriction off), or use the docker provider",
        )


def _searchable(path: Path) -> None:
    """Give `path` and its ancestors search permission for others (bwrap resolves bind sources as the
    sandbox uid); never read or write permission. A relative path counts from the working directory, and
    a path through symlinks needs its real folders searchable too."""
    chain = {q for base in {path.absolute(), path.resolve()} for q in (base, *base.parents)}
    for p in sorted(chain):
        with contextlib.suppress(OSError):
            mode = p.stat().st_mode
            if not mode & stat.S_IXOTH:
                os.chmod(p, stat.S_IMODE(mode) | stat.S_IXOTH)
                log.info("local sandbox: added o+x to %s so the sandbox uid can reach its workspace", p)


def _chown_tree(path: Path, uid: int) -> None:
    res = run_cmd(["chown", "-R", "--no-dereference", f"{uid}:{uid}", str(path)], timeout=600, umask=UMASK)
    if res.returncode != 0:
        raise SandboxError(f"chown failed: {res.stderr.strip()}", file=str(path))
