"""E2B templates for task images: a `TemplateSpec` rendered with the e2b SDK's v2 builder.

The recipe is the spec's own (`TemplateSpec.steps()`, shared with the Docker backend); E2B runs the start
command at build time and snapshots the sandbox with it running. Inputs are staged under stable names, so
the spec hash does not depend on where they live on this machine.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from e2b import Template, TemplateClass, wait_for_url

from ..errors import SandboxError
from ..util import sha256_bytes, stable_json
from .base import TemplateRecord
from .e2b_api import E2BApi
from .spec import TemplateSpec

log = logging.getLogger("sweflow.sandbox.e2b")

READY_PACKAGES = ("curl",)  # wait_for_url's ready check runs curl
WORKDIR = "/testbed"
_FIELDS = (
    "image",
    "packages",
    "claude_binary",
    "runtime_wheel",
    "start_cmd",
    "health_url",
    "cpu",
    "memory_mb",
    "env",
)


def template_inputs(spec: Any = None, **fields: Any) -> TemplateSpec:
    """The TemplateSpec to render: `spec` itself, or one made from a mapping / keywords (keywords override).

    E2B templates need the Claude binary and the runtime wheel, so both are required here."""
    if isinstance(spec, TemplateSpec):
        got: dict[str, Any] = {}
        base: TemplateSpec | None = spec
    elif isinstance(spec, Mapping):
        got, base = dict(spec), None
    elif spec is None:
        got, base = {}, None
    else:  # any object with the TemplateSpec attributes
        got = {k: getattr(spec, k) for k in _FIELDS if getattr(spec, k, None) is not None}
        base = None
    got.update({k: v for k, v in fields.items() if v is not None})
    unknown = set(got) - set(_FIELDS)
    if unknown:
        raise SandboxError(f"unknown template fields {sorted(unknown)}", field="e2b template")
    for key in ("claude_binary", "runtime_wheel"):
        if key in got:
            got[key] = Path(got[key])
    if "packages" in got:
        got["packages"] = tuple(got["packages"])
    if "env" in got and isinstance(got["env"], Mapping):
        got["env"] = tuple(sorted(got["env"].items()))
    if base is None:
        if not got.get("image"):
            raise SandboxError("missing template field", field="image")
        out = TemplateSpec(**got)
    else:
        out = dataclasses.replace(base, **got)
    for key in ("claude_binary", "runtime_wheel"):
        if getattr(out, key) is None:
            raise SandboxError("missing template field", field=key, file=out.image)
    return out


# The SDK copies files relative to a context folder; the binary and the wheel are staged there under stable
# names (hard links when possible), so the files hash, and the spec hash, do not depend on where the inputs
# live on this machine.
def _stage(src: Path, dst: Path, mode: int) -> None:
    if not src.is_file():
        raise SandboxError("file not found", file=str(src), hint="build or download it before the template")
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    # the SDK hashes the mode: fix it so the files hash depends on content only
    os.chmod(dst, mode)


# The recipe is the spec's own (`TemplateSpec.steps()`, shared with the Docker backend): the task image
# (Debian-based) as root, apt packages (+ curl for the ready check), the Claude Code binary at
# /usr/local/bin/claude, the sweflow wheel installed --no-deps into the isolated venv at /opt/sweflow/runtime;
# then workdir /testbed and the blackbox server as start command, ready when its /health answers. E2B runs the
# start command at build time and snapshots the sandbox with it running (it does not see the envs given to
# Sandbox.create).
def e2b_template_from_spec(
    spec: Any = None, *, context_dir: str | os.PathLike | None = None, **fields: Any
) -> TemplateClass:
    """The v2 builder Template rendering `spec.steps()` (the same recipe the Docker backend renders).

    Copied inputs are staged into `context_dir` under their destination's base name (a fresh temp
    folder, removed with the template object, when None); it must outlive a build of the template."""
    spec = template_inputs(spec, **fields)
    ctx = Path(tempfile.mkdtemp(prefix="sweflow-e2b-ctx-")) if context_dir is None else Path(context_dir)
    ctx.mkdir(parents=True, exist_ok=True)
    try:
        template = _render(spec, ctx)
    except BaseException:
        if context_dir is None:
            shutil.rmtree(ctx, ignore_errors=True)
        raise
    if context_dir is None:
        weakref.finalize(template, shutil.rmtree, str(ctx), True)
    return template


def _render(spec: TemplateSpec, ctx: Path) -> TemplateClass:
    builder = Template(file_context_path=str(ctx)).from_image(spec.image).set_user("root")
    for step in spec.steps():
        if step.kind == "apt":
            packages = list(dict.fromkeys([*step.args, *READY_PACKAGES]))
            builder = builder.apt_install(packages, no_install_recommends=True)
        elif step.kind == "copy":
            staged = Path(step.dest).name
            _stage(Path(step.src), ctx / staged, step.mode)
            builder = builder.copy(staged, step.dest, mode=step.mode)
        elif step.kind == "run":
            builder = builder.run_cmd(step.args[0])
        else:
            raise SandboxError(f"unknown build step kind {step.kind!r}", file=spec.image, field="steps")
    if spec.env:
        builder = builder.set_envs(dict(spec.env))
    return builder.set_workdir(WORKDIR).set_start_cmd(spec.start_cmd, wait_for_url(spec.health_url))


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
    provider: E2BApi,
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
    cpu = cpu_count or inp.cpu
    mem = memory_mb or inp.memory_mb
    with tempfile.TemporaryDirectory(prefix="sweflow-e2b-ctx-") as ctx:
        template = e2b_template_from_spec(inp, context_dir=ctx)
        steps = template_steps(template)
        e2b_hash = template_spec_hash(template)
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
        spec_hash=inp.spec_hash(),
        build_id=str(info.build_id),
        extra={
            "template_id": str(info.template_id),
            "cpu_count": cpu,
            "memory_mb": mem,
            "e2b_template_hash": e2b_hash,
        },
    )


def _wait_for_build(
    provider: E2BApi,
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
                f"E2B template build {info.build_id} failed: {message}",
                file=image,
                field=where,
            )
        if time.monotonic() > deadline:
            raise SandboxError(
                f"E2B template build {info.build_id} still {state} after {build_timeout:.0f}s",
                file=image,
                field="build",
            )
        time.sleep(poll_interval)
