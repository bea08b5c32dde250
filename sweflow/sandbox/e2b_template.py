"""E2B templates for task images, with the e2b SDK's v2 builder.

Every template: the task image (Debian-based), root user, apt packages (+ python3, python3-venv and
curl, which the runtime and the ready check need), the Claude Code binary at /usr/local/bin/claude,
the sweflow wheel installed --no-deps into an isolated venv at /opt/sweflow/runtime, and the
blackbox server as start command, ready when its /health answers. E2B runs the start command at
build time and snapshots the sandbox with it running.

The SDK copies files relative to a context folder; the binary and the wheel are staged there
under stable names (hard links when possible), so the files hash, and the spec hash, do not depend
on where the inputs live on this machine.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from e2b import Template, TemplateClass, wait_for_url

from ..errors import SandboxError
from ..util import sha256_bytes, stable_json
from .base import BLACKBOX_PORT, TemplateRecord

if TYPE_CHECKING:
    from .e2b import E2BProvider

log = logging.getLogger("sweflow.sandbox.e2b")

RUNTIME_DIR = "/opt/sweflow/runtime"
WHEEL_DIR = "/opt/sweflow/wheels"
CLAUDE_PATH = "/usr/local/bin/claude"
DEFAULT_START_CMD = f"{RUNTIME_DIR}/bin/python -m sweflow.blackbox --host 0.0.0.0 --port {BLACKBOX_PORT}"
DEFAULT_HEALTH_URL = f"http://127.0.0.1:{BLACKBOX_PORT}/health"
REQUIRED_PACKAGES = ("python3", "python3-venv", "curl")
_FIELDS = ("image", "packages", "claude_binary", "runtime_wheel", "start_cmd", "health_url")


@dataclass(frozen=True)
class E2BTemplateInputs:
    """What an E2B template is made of; read from a TemplateSpec, a mapping or keywords."""

    image: str
    claude_binary: Path
    runtime_wheel: Path
    packages: tuple[str, ...] = ()
    start_cmd: str = DEFAULT_START_CMD
    health_url: str = DEFAULT_HEALTH_URL
    cpu: int | None = None
    memory_mb: int | None = None


def template_inputs(spec: Any = None, **fields: Any) -> E2BTemplateInputs:
    """Collect the template fields from `spec` (object with attributes, or mapping) and keyword overrides."""
    if isinstance(spec, E2BTemplateInputs) and not fields:
        return spec
    got: dict[str, Any] = {}
    for key in (*_FIELDS, "cpu", "memory_mb"):
        if isinstance(spec, Mapping) and key in spec:
            got[key] = spec[key]
        elif spec is not None and not isinstance(spec, Mapping) and getattr(spec, key, None) is not None:
            got[key] = getattr(spec, key)
    got.update({k: v for k, v in fields.items() if v is not None})
    unknown = set(got) - set(_FIELDS) - {"cpu", "memory_mb"}
    if unknown:
        raise SandboxError(f"unknown template fields {sorted(unknown)}", field="e2b template")
    for key in ("image", "claude_binary", "runtime_wheel"):
        if not got.get(key):
            raise SandboxError("missing template field", field=key, file=str(got.get("image", "")) or None)
    return E2BTemplateInputs(
        image=str(got["image"]),
        claude_binary=Path(got["claude_binary"]),
        runtime_wheel=Path(got["runtime_wheel"]),
        packages=tuple(got.get("packages") or ()),
        start_cmd=got.get("start_cmd") or DEFAULT_START_CMD,
        health_url=got.get("health_url") or DEFAULT_HEALTH_URL,
        cpu=got.get("cpu"),
        memory_mb=got.get("memory_mb"),
    )


def _stage(src: Path, dst: Path) -> None:
    if not src.is_file():
        raise SandboxError("file not found", file=str(src), hint="build or download it before the template")
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    # the SDK hashes the mode: fix it so the hash depends on content only
    os.chmod(dst, 0o755 if dst.name == "claude" else 0o644)


def e2b_template_from_spec(
    spec: Any = None, *, context_dir: str | os.PathLike | None = None, **fields: Any
) -> TemplateClass:
    """The v2 builder Template for a spec. The inputs are staged into `context_dir` (a fresh temp
    folder, removed with the template object, when None); it must outlive a build of the template."""
    inp = template_inputs(spec, **fields)
    if context_dir is None:
        ctx = Path(tempfile.mkdtemp(prefix="sweflow-e2b-ctx-"))
    else:
        ctx = Path(context_dir)
        ctx.mkdir(parents=True, exist_ok=True)
    wheel_name = inp.runtime_wheel.name
    try:
        _stage(inp.claude_binary, ctx / "claude")
        _stage(inp.runtime_wheel, ctx / wheel_name)
    except BaseException:
        if context_dir is None:
            shutil.rmtree(ctx, ignore_errors=True)
        raise
    packages = list(dict.fromkeys([*inp.packages, *REQUIRED_PACKAGES]))
    template = (
        Template(file_context_path=str(ctx))
        .from_image(inp.image)
        .set_user("root")
        .apt_install(packages, no_install_recommends=True)
        .copy("claude", CLAUDE_PATH, mode=0o755)
        .copy(wheel_name, f"{WHEEL_DIR}/{wheel_name}", mode=0o644)
        .run_cmd(
            [
                f"python3 -m venv {RUNTIME_DIR}",
                f"{RUNTIME_DIR}/bin/pip install --no-deps --no-index {WHEEL_DIR}/{wheel_name}",
            ]
        )
        .set_start_cmd(inp.start_cmd, wait_for_url(inp.health_url))
    )
    if context_dir is None:
        weakref.finalize(template, shutil.rmtree, str(ctx), True)
    return template


def template_steps(template: TemplateClass) -> list[dict[str, Any]]:
    """The build steps as the API receives them (type, args, filesHash); reads the staged files."""
    return json.loads(Template.to_json(template))["steps"]


def template_spec_hash(template: TemplateClass) -> str:
    """sha256 of the template's API form: changes iff an instruction or a copied file changes."""
    return sha256_bytes(stable_json(json.loads(Template.to_json(template)), indent=None))


def describe_step(step: str | None, steps: list[dict[str, Any]], image: str) -> str:
    """Human name of a build step as the API reports it ("base", "finalize" or a 1-based number)."""
    if step in (None, ""):
        return "unknown step"
    if step == "base":
        return f"step base (FROM {image})"
    if step == "finalize":
        return "step finalize (start command / ready check)"
    try:
        i = int(step)
    except ValueError:
        return f"step {step}"
    if 1 <= i <= len(steps):
        s = steps[i - 1]
        text = " ".join(str(a) for a in (s.get("args") or [])[:1])
        return f"step {i} ({s.get('type')} {text[:160]})"
    return f"step {i}"


def build_e2b_template(
    provider: E2BProvider,
    spec: Any,
    name: str | None,
    *,
    cpu_count: int | None = None,
    memory_mb: int | None = None,
    build_timeout: float = 3600.0,
    poll_interval: float = 2.0,
    on_log: Callable[[str], None] | None = None,
    **fields: Any,
) -> TemplateRecord:
    """Build template `name` and wait for it; failures raise SandboxError naming the image and the step.

    Uses Template.build_in_background + Template.get_build_status (the same requests
    Template.build makes) rather than Template.build, because only the status answer carries the
    failing step, and Template.build has no overall deadline."""
    inp = template_inputs(spec, **fields)
    if not name:
        raise SandboxError("template name is required", file=inp.image, field="name")
    cpu = cpu_count or inp.cpu or 2
    mem = memory_mb or inp.memory_mb or 2048
    with tempfile.TemporaryDirectory(prefix="sweflow-e2b-ctx-") as ctx:
        template = e2b_template_from_spec(inp, context_dir=ctx)
        steps = template_steps(template)
        spec_hash = template_spec_hash(template)
        what = f"E2B template build request for {name!r}"
        info = provider.call(
            lambda: Template.build_in_background(
                template, name, cpu_count=cpu, memory_mb=mem, **provider.api_params()
            ),
            what=what,
            file=inp.image,
        )
        log.info("e2b template %s: build %s started for %s", name, info.build_id, inp.image)
        _wait_for_build(provider, info, inp.image, steps, build_timeout, poll_interval, on_log)
    log.info("e2b template %s: build %s ready", name, info.build_id)
    return TemplateRecord(
        image=inp.image,
        provider="e2b",
        template=name,
        spec_hash=spec_hash,
        build_id=str(info.build_id),
        extra={"template_id": str(info.template_id), "cpu_count": cpu, "memory_mb": mem},
    )


def _wait_for_build(
    provider: E2BProvider,
    info: Any,
    image: str,
    steps: list[dict[str, Any]],
    build_timeout: float,
    poll_interval: float,
    on_log: Callable[[str], None] | None,
) -> None:
    deadline = time.monotonic() + build_timeout
    offset = 0
    while True:
        status = provider.call(
            lambda at=offset: Template.get_build_status(info, logs_offset=at, **provider.api_params()),
            what=f"E2B build status of {info.build_id}",
            file=image,
        )
        offset += len(status.log_entries)
        for entry in status.log_entries:
            line = provider.clean(entry.message)
            log.debug("e2b build %s: %s", info.build_id, line)
            if on_log:
                on_log(line)
        state = status.status.value
        if state == "ready":
            return
        if state == "error":
            reason = status.reason
            where = describe_step(reason.step if reason else None, steps, image)
            message = provider.clean(reason.message) if reason else "no reason given"
            raise SandboxError(
                f"E2B template build {info.build_id} failed at {where}: {message}",
                file=image,
                field="e2b template",
            )
        if time.monotonic() > deadline:
            raise SandboxError(
                f"E2B template build {info.build_id} still {state} after {build_timeout:.0f}s",
                file=image,
                field="e2b template",
            )
        time.sleep(poll_interval)
