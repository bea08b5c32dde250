"""The production env's lock (envs/train-verl.*): its pins, and which declared requirements it leaves unmet.

`uv pip compile` makes the lock; this module only reads it. The target is the production machine: Python
3.12 on Linux x86_64 (`TARGET`), so environment markers are evaluated for it, not for this interpreter.
"""

from __future__ import annotations

import email
import re
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

TARGET_PYTHON = "3.12"
TARGET_PLATFORM = "x86_64-manylinux_2_28"  # uv's --python-platform
TARGET = {
    "python_version": "3.12",
    "python_full_version": "3.12.1",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)(?:\[[^\]]*\])?==([^\s;#]+)")


def read_pins(path: str | Path) -> dict[str, Version]:
    """Exact `name==version` lines of a requirements or lock file (names canonical, extras dropped)."""
    pins: dict[str, Version] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        m = _PIN.match(line.strip())
        if m and "*" not in m.group(2):  # a wildcard (`==9.27.*`) is a range, not a pin
            pins[canonicalize_name(m.group(1))] = Version(m.group(2))
    return pins


def wheel_requires(wheel: str | Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(zf.read(name))
    return list(meta.get_all("Requires-Dist") or [])


def wanted_on_target(req: Requirement, extras: Iterable[str] = ()) -> bool:
    """Whether `req` is wanted on the target with `extras` requested."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**TARGET, "extra": e}) for e in ("", *extras))


def unmet(
    requires: Iterable[str],
    pins: Mapping[str, Version],
    *,
    extras: Iterable[str] = (),
    requires_of: Callable[[str, Version], list[str]] | None = None,
    _seen: set | None = None,
) -> list[tuple[str, str]]:
    """(requirement, why) for each declared requirement the pins do not satisfy on the target.

    With `requires_of(name, version)`, the extras a requirement asks of a pinned package are followed too
    (megatron-bridge asks megatron-core[dev,mlm]).
    """
    seen = set() if _seen is None else _seen
    out: list[tuple[str, str]] = []
    wanted = tuple(extras)
    for text in requires:
        req = Requirement(text)
        if not wanted_on_target(req, wanted):
            continue
        name = canonicalize_name(req.name)
        have = pins.get(name)
        if have is None:
            out.append((str(req), "absent from the lock"))
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            out.append((str(req), f"the lock has {have}"))
        key = (name, tuple(sorted(req.extras)))
        if req.extras and requires_of is not None and key not in seen:
            seen.add(key)
            nested = unmet(
                requires_of(name, have), pins, extras=req.extras, requires_of=requires_of, _seen=seen
            )
            out += [(r, f"{why} (via {name}[{','.join(sorted(req.extras))}])") for r, why in nested]
    return out
