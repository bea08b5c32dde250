"""Build one template per image with retries, and write byte-stable success or failure records.

`build_template` raises on final failure (SandboxError naming image and step); `build_and_record` is the
pipeline entry: it skips a build whose spec hash equals the existing good record's, and on failure writes
{image, ok: false, provider, step, error} instead of raising, so one broken image never stops the others.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..errors import SandboxError
from ..schema import default
from ..util import atomic_write_json, log, read_json, redact, retry
from .base import Provider, TemplateRecord
from .spec import TemplateSpec, template_name

_STEP_RE = re.compile(r"(Step \d+/\d+ : .*?) (?:failed|timed out)")


def step_of(exc: BaseException) -> str:
    """The build step an error names: the Dockerfile step if known, else the error's field, else 'build'."""
    m = _STEP_RE.search(str(exc))
    if m:
        return m.group(1)[:200]
    return getattr(exc, "field", None) or "build"


def _provider_build(provider: Provider, spec: TemplateSpec, name: str, **source: Any) -> TemplateRecord:
    if hasattr(provider, "build"):
        return provider.build(spec, name, **source)
    if hasattr(provider, "build_template"):  # the E2B provider
        return provider.build_template(spec, name, **source)
    raise SandboxError(f"provider {provider.name!r} cannot build templates", field="provider")


def build_template(
    provider: Provider,
    image: str,
    *,
    spec: TemplateSpec,
    name: str | None = None,
    attempts: int = default("sandbox.build_attempts"),
    backoff: float = 2.0,
    **source: Any,
) -> TemplateRecord:
    """Build the template for `image` (default name: template_name(image)), retrying with backoff.

    `source` goes to the provider (local: repo=, commit=). Final failure raises SandboxError(file=image,
    field=<failing step>).
    """
    name = name or template_name(image)
    if spec.image != image:
        raise SandboxError(f"spec is for {spec.image}", file=image, field="image")
    try:
        return retry(
            lambda: _provider_build(provider, spec, name, **source),
            attempts=attempts,
            backoff=backoff,
            what=f"template build {name} ({image})",
        )
    except SandboxError as exc:
        raise SandboxError(
            f"template build failed after {attempts} attempt(s): {exc.problem}",
            file=image,
            field=step_of(exc),
        ) from exc
    except Exception as exc:  # noqa: BLE001 - an SDK fault still names image and step
        raise SandboxError(
            f"template build failed after {attempts} attempt(s): {exc}", file=image, field=step_of(exc)
        ) from exc


def write_build_record(
    path: str | os.PathLike,
    *,
    record: TemplateRecord | None = None,
    image: str | None = None,
    provider: str | None = None,
    step: str | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """Atomically write the success record (record + ok: true) or a failure record; secrets redacted."""
    if record is not None:
        data = {**record.to_dict(), "ok": True}
    else:
        if not image:
            raise SandboxError("a failure record needs the image", file=str(path), field="image")
        data = {
            "image": image,
            "provider": provider or "",
            "ok": False,
            "step": redact(step or "build"),
            "error": redact(error or ""),
        }
    atomic_write_json(path, data)
    return data


def build_and_record(
    provider: Provider,
    image: str,
    record_path: str | os.PathLike,
    *,
    spec: TemplateSpec,
    name: str | None = None,
    attempts: int = default("sandbox.build_attempts"),
    backoff: float = 2.0,
    **source: Any,
) -> dict[str, Any]:
    """Build unless the record at `record_path` is ok with the same spec hash; always leave a record."""
    path = Path(record_path)
    want = spec.spec_hash()
    if path.exists():
        try:
            old = read_json(path)
        except ValueError:
            old = {}
        if old.get("ok") and old.get("spec_hash") == want and old.get("provider") == provider.name:
            exists = getattr(provider, "has_template", None)
            if exists is None or exists(old["template"]):
                log.info("template %s up to date (spec %s)", old["template"], want[:12])
                return old
    try:
        rec = build_template(
            provider, image, spec=spec, name=name, attempts=attempts, backoff=backoff, **source
        )
    except SandboxError as exc:
        log.error("%s", exc)
        return write_build_record(path, image=image, provider=provider.name, step=exc.field, error=str(exc))
    return write_build_record(path, record=rec)
