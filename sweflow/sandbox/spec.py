"""Template spec: one description of a sandbox template, rendered per provider.

A template = a task image + OS packages + the Claude Code binary at /usr/local/bin/claude + an isolated
runtime venv at /opt/sweflow/runtime (the image's system python, the sweflow wheel --no-deps, so the task's
own Python/conda stays untouched) + a start command serving the blackbox on :31000.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..schema import default
from ..util import sha256_bytes, sha256_file, stable_json
from .base import BLACKBOX_PORT

SPEC_FORMAT = 1  # bump when the rendering changes in a way that must rebuild every template
DEFAULT_PACKAGES = ("bash", "curl", "git", "patch", "ca-certificates")
RUNTIME_DIR = "/opt/sweflow/runtime"
CLAUDE_PATH = "/usr/local/bin/claude"
WHEEL_DIR = "/opt/sweflow/wheel"
# Port and bind address come from the environment so the Docker/local backends can remap them per sandbox
# under a shared host network; E2B's start command sees no envs and gets the defaults.
DEFAULT_START_CMD = (
    f"exec {RUNTIME_DIR}/bin/python -m sweflow.blackbox"
    f" --host ${{SWEFLOW_BLACKBOX_HOST:-0.0.0.0}} --port ${{SWEFLOW_BLACKBOX_PORT:-{BLACKBOX_PORT}}}"
)
DEFAULT_HEALTH_URL = f"http://127.0.0.1:{BLACKBOX_PORT}/health"
NAME_MAX = 60


@functools.lru_cache(maxsize=64)
def _cached_sha(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(path)


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file, memoised on (path, size, mtime) because the Claude binary is ~400 MB."""
    st = os.stat(path)
    return _cached_sha(str(path), st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class Step:
    """One provider-neutral build step. kind: "apt" (args=packages), "copy" (src, dest, mode), "run" (cmd)."""

    kind: str
    args: tuple[str, ...] = ()
    src: str = ""
    dest: str = ""
    mode: int = 0o644


@dataclass(frozen=True)
class TemplateSpec:
    """Everything that determines a template build; `spec_hash()` covers all of it."""

    image: str
    packages: tuple[str, ...] = DEFAULT_PACKAGES
    claude_binary: Path | None = None
    runtime_wheel: Path | None = None
    start_cmd: str = DEFAULT_START_CMD
    health_url: str = DEFAULT_HEALTH_URL
    cpu: int = default("sandbox.e2b.cpu_count")
    memory_mb: int = default("sandbox.e2b.memory_mb")
    env: tuple[tuple[str, str], ...] = field(default=())

    def artifact_checksums(self) -> dict[str, str]:
        out = {}
        if self.claude_binary is not None:
            out["claude"] = file_sha256(self.claude_binary)
        if self.runtime_wheel is not None:
            out["wheel"] = file_sha256(self.runtime_wheel)
            out["wheel_name"] = Path(self.runtime_wheel).name
        return out

    def hash_inputs(self) -> dict[str, Any]:
        return {
            "format": SPEC_FORMAT,
            "image": self.image,
            "packages": sorted(self.packages),
            "artifacts": self.artifact_checksums(),
            "start_cmd": self.start_cmd,
            "health_url": self.health_url,
            "cpu": self.cpu,
            "memory_mb": self.memory_mb,
            "env": sorted(self.env),
        }

    def spec_hash(self) -> str:
        """Stable sha256 over the image, packages, artifact checksums, start command and resources."""
        return sha256_bytes(stable_json(self.hash_inputs(), indent=None))

    # `steps()` is the provider-neutral build recipe ("apt", "copy", "run" steps); `to_dockerfile()` renders
    # it for Docker and the E2B engineer renders the same steps with the E2B Template builder.
    def steps(self) -> list[Step]:
        """The build recipe. `copy` sources are absolute local paths; Docker maps them into its context."""
        steps = [Step("apt", tuple(sorted(set(self.packages) | {"python3", "python3-venv"})))]
        if self.claude_binary is not None:
            steps.append(Step("copy", src=str(self.claude_binary), dest=CLAUDE_PATH, mode=0o755))
        if self.runtime_wheel is not None:
            wheel = Path(self.runtime_wheel).name
            steps.append(Step("copy", src=str(self.runtime_wheel), dest=f"{WHEEL_DIR}/{wheel}"))
            steps.append(Step("run", (runtime_install_cmd(f"{WHEEL_DIR}/{wheel}"),)))
        return steps

    def to_dockerfile(self, *, artifacts_image: str | dict[str, str] | None = None) -> str:
        """Render a Dockerfile (root user). Copies come from the build context by file name, or from
        `artifacts_image` (one image, or {file name: image}; see artifacts_dockerfile) so the 400 MB
        binary is not resent with every build context."""
        lines = [f"FROM {self.image}", "USER root"]
        for step in self.steps():
            if step.kind == "apt":
                lines.append(f"RUN {apt_install_cmd(step.args)}")
            elif step.kind == "copy":
                src = Path(step.src).name
                from_image = (
                    artifacts_image.get(src) if isinstance(artifacts_image, dict) else artifacts_image
                )
                if from_image:
                    lines.append(f"COPY --from={from_image} /{src} {step.dest}")
                else:
                    lines.append(f"COPY {src} {step.dest}")
                lines.append(f"RUN chmod {step.mode:o} {step.dest}")
            elif step.kind == "run":
                lines.append(f"RUN {step.args[0]}")
        for k, v in sorted(self.env):
            lines.append(f"ENV {k}={_dq(v)}")
        probe = self.health_url.replace(
            f":{BLACKBOX_PORT}/", f":${{SWEFLOW_BLACKBOX_PORT:-{BLACKBOX_PORT}}}/"
        )
        lines.append(
            "HEALTHCHECK --interval=2s --timeout=3s --start-period=1s --retries=30 "
            f'CMD ["/bin/bash", "-c", "curl -fsS {probe} || exit 1"]'
        )
        lines.append("WORKDIR /testbed")
        lines.append(f'CMD ["/bin/bash", "-c", {_json_str(self.start_cmd)}]')
        return "\n".join(lines) + "\n"

    def e2b_inputs(self) -> dict[str, Any]:
        """Plain data for the E2B renderer: image, steps, start command, ready URL, resources."""
        return {
            "image": self.image,
            "steps": [
                {"kind": s.kind, "args": list(s.args), "src": s.src, "dest": s.dest, "mode": s.mode}
                for s in self.steps()
            ],
            "start_cmd": self.start_cmd,
            "ready_url": self.health_url,
            "cpu": self.cpu,
            "memory_mb": self.memory_mb,
            "env": dict(self.env),
        }


def apt_install_cmd(packages: tuple[str, ...] | list[str]) -> str:
    """Install only the missing packages, so images that already have them need no network."""
    pkgs = " ".join(packages)
    return (
        "set -e; missing=''; "
        f'for p in {pkgs}; do dpkg -s $p >/dev/null 2>&1 || missing="$missing $p"; done; '
        'if [ -n "$missing" ]; then export DEBIAN_FRONTEND=noninteractive; apt-get update -qq'
        " && apt-get install -y -qq --no-install-recommends $missing && rm -rf /var/lib/apt/lists/*; fi"
    )


def runtime_install_cmd(wheel_path: str) -> str:
    """Create the isolated runtime venv from the system python and install the wheel without deps."""
    return (
        f"set -e; /usr/bin/python3 -m venv {RUNTIME_DIR}"
        f" && {RUNTIME_DIR}/bin/python -m pip install -q --no-deps --no-index --ignore-requires-python"
        f" --disable-pip-version-check {wheel_path}"
        f" && rm -f {wheel_path}"
    )


def artifacts_dockerfile(files: list[str]) -> str:
    """A scratch image holding the artifacts at /<name>, built once and copied from by every template."""
    return "FROM scratch\n" + "".join(f"COPY {f} /{f}\n" for f in files)


def template_name(image: str, *, prefix: str = "sweflow") -> str:
    """Deterministic template name from an image: lowercase [a-z0-9-], <= 60 chars, 8-hex hash suffix.

    `sweflow-sample/sweb.eval.x86_64.sweflow_s_calclib-1:latest` -> `sweflow-sweflow-s-calclib-1-<hash>`.
    """
    ref = image.rsplit("/", 1)[-1]
    repo, _, tag = ref.partition(":")
    repo = re.sub(r"^sweb\.eval\.x86_64\.", "", repo)
    body = repo if tag in ("", "latest") else f"{repo}-{tag}"
    slug = re.sub(r"[^a-z0-9]+", "-", body.lower()).strip("-")
    suffix = sha256_bytes(image)[:8]
    room = NAME_MAX - len(prefix) - len(suffix) - 2
    slug = slug[:room].strip("-")
    return "-".join(p for p in (prefix, slug, suffix) if p)


def _dq(v: str) -> str:
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _json_str(s: str) -> str:
    import json

    return json.dumps(s)
