"""The `sandbox` config section as typed, frozen settings: one object per provider sub-section (local, docker,
e2b), the network of fresh evaluations, and the common part (`SandboxSettings`). Built once per stage from the
validated config (defaults from the schema only) and carried through a spec (`to_spec`, `from_spec`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..schema import check_spec_keys, defaults, section_settings
from .limits import LimitSpec


@dataclass(frozen=True)
class LocalSettings:
    """`sandbox.local`: the templates' folder and the caps of one sandbox (0 turns one off)."""

    # Only a root the section gives: a partial section (a caller outside the workflow) leaves the provider's
    # own folder, never the workflow's relative default.
    templates_root: str | None
    pids_limit: int
    mem_mb: int
    file_size_mb: int
    scratch_mb: int

    @classmethod
    def from_config(cls, local: Mapping[str, Any] | None) -> LocalSettings:
        d = defaults("sandbox.local", local)
        return cls(
            templates_root=(local or {}).get("templates_root"),
            pids_limit=d["pids_limit"],
            mem_mb=d["mem_mb"],
            file_size_mb=d["file_size_mb"],
            scratch_mb=d["scratch_mb"],
        )

    def limits(self) -> LimitSpec:
        return LimitSpec(
            pids=int(self.pids_limit),
            memory_mb=int(self.mem_mb),
            file_size_mb=int(self.file_size_mb),
            scratch_mb=int(self.scratch_mb),
        )


@dataclass(frozen=True)
class DockerSettings:
    """`sandbox.docker`: the container's caps (``cpus`` as configured, an integer or a fraction)."""

    cpus: float
    mem_mb: int
    pids_limit: int
    file_size_mb: int
    disk_mb: int

    @classmethod
    def from_config(cls, docker: Mapping[str, Any] | None) -> DockerSettings:
        return section_settings(cls, "sandbox.docker", docker)


@dataclass(frozen=True)
class E2BSettings:
    """`sandbox.e2b`: the template's size and name prefix."""

    cpu_count: int
    memory_mb: int
    template_prefix: str

    @classmethod
    def from_config(cls, e2b: Mapping[str, Any] | None) -> E2BSettings:
        return section_settings(cls, "sandbox.e2b", e2b)


@dataclass(frozen=True)
class NetworkSettings:
    """`sandbox.network`: the network of fresh evaluations (``eval``, per-repository ``eval_repos``) and the
    Docker network an internet evaluation joins; ``sweflow.grading.evaluate.eval_network`` reads it."""

    eval: str
    eval_repos: Mapping[str, str]
    docker_network: str

    @classmethod
    def from_config(cls, network: Mapping[str, Any] | None) -> NetworkSettings:
        d = defaults("sandbox.network", network)
        return cls(eval=d["eval"], eval_repos=dict(d["eval_repos"]), docker_network=d["docker_network"])


_SECTIONS = {"local": LocalSettings, "docker": DockerSettings, "e2b": E2BSettings, "network": NetworkSettings}


@dataclass(frozen=True)
class SandboxSettings:
    """The whole `sandbox` section: the provider, the template build (prebuilt, attempts, the Docker base
    image, the Claude Code version, the packages), the sandbox timeout and the sub-sections."""

    provider: str
    timeout_sec: int
    prebuilt: bool
    build_attempts: int
    base_image: str
    claude_code_version: str
    packages: tuple[str, ...]
    local: LocalSettings
    docker: DockerSettings
    e2b: E2BSettings
    network: NetworkSettings

    @classmethod
    def from_config(cls, sandbox: Mapping[str, Any] | None) -> SandboxSettings:
        """From the `sandbox` section (the schema's defaults filled in where it is partial)."""
        given = dict(sandbox or {})
        s = defaults("sandbox", given)
        return cls(
            provider=s["provider"],
            timeout_sec=s["timeout_sec"],
            prebuilt=s["prebuilt"],
            build_attempts=s["build_attempts"],
            base_image=s["base_image"],
            claude_code_version=s["claude_code_version"],
            packages=tuple(s["packages"]),
            **{name: kind.from_config(given.get(name)) for name, kind in _SECTIONS.items()},
        )

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], *, where: str = "sandbox") -> SandboxSettings:
        """What ``to_spec`` wrote: every field of every sub-section present, nothing else."""
        check_spec_keys(cls, spec, where)
        for name, kind in _SECTIONS.items():
            check_spec_keys(kind, spec[name], f"{where}.{name}")
        return cls.from_config(spec)

    def to_spec(self) -> dict[str, Any]:
        """The section as the validated config holds it (JSON-equal to it: the same keys and values)."""
        out = asdict(self)
        out["packages"] = list(self.packages)
        return out
