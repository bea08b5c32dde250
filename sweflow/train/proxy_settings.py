"""The token-recording proxy's settings (`train.proxy`): one typed object, built once from the validated
config (defaults from the schema only) and carried to a rollout spec and back without defaults of its own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..schema import check_spec_keys, section_settings


@dataclass(frozen=True)
class ProxySettings:
    """Where the proxy listens (port 0: a free one), the URL sandboxes reach it by (None: the listening
    address), and how it builds prompts (``build_mode`` tito | render, ``build_model``)."""

    host: str
    port: int
    public_url: str | None
    build_mode: str
    build_model: str

    @classmethod
    def from_config(cls, train: Mapping[str, Any]) -> ProxySettings:
        """From the `train` section (its `proxy`, the schema's defaults filled in)."""
        return section_settings(cls, "train.proxy", train.get("proxy"))

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], *, where: str = "proxy") -> ProxySettings:
        """What ``to_spec`` wrote: every field present, nothing else."""
        check_spec_keys(cls, spec, where)
        return cls(**spec)

    def to_spec(self) -> dict[str, Any]:
        return asdict(self)

    def port_for_rank(self, rank: int) -> int:
        """A fixed port is the first rank's; every other process of a run takes the next ones (0: free)."""
        return self.port + rank if self.port else 0
