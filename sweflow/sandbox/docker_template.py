"""Docker templates: images built from `TemplateSpec.to_dockerfile()` on the task image.

The Claude binary and the runtime wheel come from one scratch image per file (`artifact_images`), which the
template COPYs --from. `DockerTemplates` is mixed into `DockerProvider` (`sweflow.sandbox.docker`), whose
`__init__` sets what it reads (client, api_long, build_cache).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from ..errors import SandboxError
from ..util import sha256_bytes
from .base import TemplateRecord
from .docker_api import _call
from .spec import TemplateSpec, artifacts_dockerfile, file_sha256

_artifact_lock = threading.Lock()


class DockerTemplates:
    """The template half of `DockerProvider`: artifact images and template images, by docker build."""

    name: str
    client: Any
    api_long: Any
    build_cache: bool

    # ---- templates -------------------------------------------------------------------------------
    def artifact_images(self, spec: TemplateSpec) -> dict[str, str]:
        """Build (once per file checksum) a scratch image per artifact; templates COPY --from them.

        One image per file, so a changed wheel (every source edit) never re-stores the 400 MB binary.
        """
        out: dict[str, str] = {}
        for f in (spec.claude_binary, spec.runtime_wheel):
            if f is None:
                continue
            name = Path(f).name
            digest = sha256_bytes(name + "\0" + file_sha256(f))[:16]
            tag = f"sweflow-artifacts:{re.sub(r'[^a-z0-9]+', '-', name.lower())[:40]}-{digest}"
            with _artifact_lock:
                if not self._image_exists(tag):
                    with tempfile.TemporaryDirectory(prefix="sweflow-artifacts-") as ctx:
                        _link_or_copy(Path(f), Path(ctx) / name)
                        (Path(ctx) / "Dockerfile").write_text(artifacts_dockerfile([name]))
                        self._build(ctx, tag, what=f"artifacts image {name}", timeout=1800)
            out[name] = tag
        return out

    def build(self, spec: TemplateSpec, name: str, *, timeout: float = 1800) -> TemplateRecord:
        """docker build of the spec's Dockerfile on its task image; the image tag is the template name.

        The image a rebuild replaces is removed (best effort) so rebuilt templates do not pile up.
        """
        if not self._image_exists(spec.image):
            raise SandboxError(
                "task image not found", file=spec.image, field="FROM", hint="build or load it first"
            )
        arts = self.artifact_images(spec)
        old = self._image_id(name)
        with tempfile.TemporaryDirectory(prefix="sweflow-build-") as ctx:
            (Path(ctx) / "Dockerfile").write_text(spec.to_dockerfile(artifacts_image=arts))
            image_id = self._build(ctx, name, what=f"template {name}", timeout=timeout, image=spec.image)
        if old and old != image_id:
            with contextlib.suppress(Exception):
                self.client.images.remove(old)
        return TemplateRecord(
            image=spec.image, provider=self.name, template=name, spec_hash=spec.spec_hash(),
            build_id=image_id, digest=image_id, extra={"artifact_images": dict(sorted(arts.items()))},
        )  # fmt: skip

    def _image_id(self, tag: str) -> str:
        try:
            return self.client.images.get(tag).id if self._image_exists(tag) else ""
        except Exception:  # noqa: BLE001 - only used for cleanup
            return ""

    def has_template(self, name: str) -> bool:
        return self._image_exists(name)

    def _image_exists(self, tag: str) -> bool:
        import docker

        try:
            _call(lambda: self.client.images.get(tag), 60, f"inspect image {tag}")
            return True
        except SandboxError as exc:
            if isinstance(exc.__cause__, docker.errors.ImageNotFound):
                return False
            raise

    def _build(self, ctx: str, tag: str, *, what: str, timeout: float, image: str = "") -> str:
        """Stream a classic build; errors name the Dockerfile step that failed."""
        state = {"step": "context", "log": []}

        def go() -> str:
            stream = self.api_long.build(
                path=ctx,
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode="host",
                decode=True,
                nocache=not self.build_cache,
            )
            for chunk in stream:
                text = chunk.get("stream", "")
                if text.startswith("Step "):
                    state["step"] = text.strip()
                if text.strip():
                    state["log"] = (state["log"] + [text.strip()])[-20:]
                if "error" in chunk:
                    detail = " | ".join(state["log"][-3:])
                    raise SandboxError(
                        f"{what}: {state['step']} failed: {chunk['error'].strip()} [{detail[-300:]}]",
                        file=image or tag,
                        field="build",
                    )
            return self.client.images.get(tag).id

        try:
            return _call(go, timeout, f"{what}: docker build ({state['step']})", template=image or tag)
        except SandboxError as exc:
            if "timed out" in str(exc):
                raise SandboxError(
                    f"{what}: {state['step']} timed out after {timeout:.0f}s",
                    file=image or tag,
                    field="build",
                ) from exc
            raise


def _link_or_copy(src: Path, dst: Path) -> None:
    import os

    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
