"""Resource limits of a local sandbox: processes, memory, file size and scratch disk, like Docker's.

Every command of a local sandbox starts through ``Limits.prefix``: rlimits, then the sandbox's own cgroups
where the host lets us make them (``Limits._make_cgroups``). ``/tmp`` and ``/root`` are a tmpfs of
``scratch_mb`` each where the host user may mount one (``Limits.mount_scratch``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..schema import default
from ..util import log

CGROUP_ROOT = Path("/sys/fs/cgroup")
_warned: set[str] = set()


@dataclass(frozen=True)
class LimitSpec:
    """The caps of one local sandbox (0 turns one off); defaults: the schema's sandbox.local."""

    pids: int = default("sandbox.local.pids_limit")
    memory_mb: int = default("sandbox.local.mem_mb")
    file_size_mb: int = default("sandbox.local.file_size_mb")
    scratch_mb: int = default("sandbox.local.scratch_mb")


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(msg)


def _write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


class Limits:
    """The live limits of one sandbox: its cgroup folders and scratch mounts; ``close`` removes them."""

    def __init__(self, name: str, spec: LimitSpec, *, cgroup_root: Path = CGROUP_ROOT) -> None:
        self.name, self.spec, self.root = name, spec, cgroup_root
        self.cgroups: list[Path] = []
        self.mounts: list[Path] = []
        self.memory_capped = self.pids_capped = False
        self._make_cgroups()

    # ---- cgroups ---------------------------------------------------------------------------------
    # The cgroups (``pids.max``, and the memory limit with swap included) are made where the host lets us:
    # cgroup v2 with the controllers delegated, or the v1 ``pids`` and ``memory`` hierarchies, writable by
    # root. Elsewhere the rlimits stand alone and the one-line warning says so (no memory cap then: RLIMIT_AS
    # would break Node's and Python's address-space reservations, Claude Code's included).
    def _make_cgroups(self) -> None:
        wanted = {}
        if self.spec.pids:
            wanted["pids"] = str(int(self.spec.pids))
        if self.spec.memory_mb:
            wanted["memory"] = str(int(self.spec.memory_mb) * 1024 * 1024)
        if not wanted:
            return
        try:
            if (self.root / "cgroup.controllers").exists():
                self._make_v2(wanted)
            else:
                self._make_v1(wanted)
        except OSError as exc:
            self.close()
            self.memory_capped = self.pids_capped = False
            _warn_once(
                "cgroup",
                f"local sandboxes: no cgroup of their own here ({exc.strerror or exc}); processes and files "
                "are capped by rlimits, memory is not",
            )

    def _make_v2(self, wanted: dict[str, str]) -> None:
        parent = self.root / "sweflow"
        parent.mkdir(exist_ok=True)
        enabled = (self.root / "cgroup.subtree_control").read_text().split()
        need = [c for c in wanted if c not in enabled]
        if need:
            _write(self.root / "cgroup.subtree_control", " ".join(f"+{c}" for c in need))
        _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
        d = parent / self.name
        d.mkdir()
        self.cgroups.append(d)
        if "pids" in wanted:
            _write(d / "pids.max", wanted["pids"])
            self.pids_capped = True
        if "memory" in wanted:
            _write(d / "memory.max", wanted["memory"])
            with contextlib.suppress(OSError):  # no swap accounting: memory.max alone
                _write(d / "memory.swap.max", "0")
            self.memory_capped = True

    def _make_v1(self, wanted: dict[str, str]) -> None:
        for ctl, value in wanted.items():
            base = self.root / ctl
            if not (base / "cgroup.procs").exists():
                raise OSError(f"no {ctl} hierarchy at {base}")
            d = base / "sweflow" / self.name
            d.mkdir(parents=True)
            self.cgroups.append(d)
            if ctl == "pids":
                _write(d / "pids.max", value)
                self.pids_capped = True
            else:
                _write(d / "memory.limit_in_bytes", value)
                with contextlib.suppress(OSError):  # the kernel may lack swap accounting
                    _write(d / "memory.memsw.limit_in_bytes", value)
                self.memory_capped = True

    # ---- per command -----------------------------------------------------------------------------
    # Every command of a local sandbox starts through ``Limits.prefix``: ``prlimit`` sets RLIMIT_FSIZE (no
    # file above ``file_size_mb``), RLIMIT_CORE 0 and, only where no pids cgroup could be made, RLIMIT_NPROC
    # (which counts the sandbox uid's processes host-wide); then a shell moves itself into the sandbox's own
    # cgroups before it execs the command, so every process the command forks is counted from its first
    # instruction.
    def prefix(self) -> list[str]:
        """argv to put in front of a sandbox command (before the privilege drop)."""
        s = self.spec
        out = ["prlimit", "--core=0:0"]
        if s.pids and not self.pids_capped:
            # RLIMIT_NPROC counts the uid's processes host-wide (every sandbox shares the uid): only
            # where no pids cgroup counts this sandbox's alone
            out.append(f"--nproc={int(s.pids)}:{int(s.pids)}")
        if s.file_size_mb:
            size = int(s.file_size_mb) * 1024 * 1024
            out.append(f"--fsize={size}:{size}")
        out.append("--")
        if self.cgroups:
            procs = " ".join(shlex.quote(str(d / "cgroup.procs")) for d in self.cgroups)
            out += [
                "/bin/sh",
                "-c",
                f'for p in {procs}; do echo $$ > "$p" || exit 125; done; exec "$@"',
                "sh",
            ]
        return out

    # ---- scratch disk ----------------------------------------------------------------------------
    # Scratch disk: ``/tmp`` and ``/root`` are a tmpfs of ``scratch_mb`` each when the host user may mount one
    # (root), so what a sandbox writes there is bounded and charged to its memory cgroup; ``/testbed`` stays a
    # host folder bounded per file by RLIMIT_FSIZE.
    def mount_scratch(self, path: Path, uid: int) -> bool:
        """A tmpfs of ``scratch_mb`` at ``path`` owned by ``uid``; False (and a warning) if not allowed."""
        if not self.spec.scratch_mb or os.geteuid() != 0:
            if self.spec.scratch_mb:
                _warn_once("scratch", "local sandboxes: /tmp and /root are not size-capped (not root)")
            return False
        opts = f"size={int(self.spec.scratch_mb)}m,mode=0700,uid={uid},gid={uid},nosuid,nodev"
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "sweflow-scratch", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if r.returncode != 0:
            _warn_once("scratch", f"local sandboxes: no scratch tmpfs here: {r.stderr.strip()[-200:]}")
            return False
        self.mounts.append(path)
        return True

    def close(self) -> None:
        """Unmount the scratch tmpfs and remove the cgroups (once their processes are gone)."""
        _unmount(self.mounts)
        _remove_cgroups(self.cgroups)
        self.mounts, self.cgroups = [], []

    @staticmethod
    def release(name: str, *, mounts: list[Path], cgroup_root: Path = CGROUP_ROOT) -> None:
        """What a crashed process left of sandbox ``name``'s limits: its mounts (those that are mount
        points) and its cgroups under v1 or v2."""
        _unmount([m for m in mounts if os.path.ismount(m)])
        dirs = (
            cgroup_root / "sweflow" / name,
            *(cgroup_root / c / "sweflow" / name for c in ("pids", "memory")),
        )
        _remove_cgroups([d for d in dirs if d.is_dir()])


def _unmount(mounts: list[Path]) -> None:
    for m in mounts:
        r = subprocess.run(["umount", str(m)], capture_output=True, timeout=30)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", str(m)], capture_output=True, timeout=30)


def _remove_cgroups(dirs: list[Path]) -> None:
    for d in reversed(dirs):
        for _ in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY:  # not a cgroup with members: nothing to wait for
                    log.warning("cannot remove %s: %s", d, exc)
                    break
                _kill_members(d)  # processes still leaving
                time.sleep(0.1)


def _kill_members(d: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        for pid in (d / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), 9)
