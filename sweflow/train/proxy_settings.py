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


CLOUD_PROVIDERS = ("e2b",)  # sandboxes outside the cluster, which reach the proxy over the internet


def cloud_reach_problem(
    provider: str, *, port: int | None, public_url: str | None, engine: str | None, where: str
) -> tuple[str, str, str] | None:
    """Why cloud sandboxes could not reach the proxy of `where` (message, field, hint), or None.

    They need one published URL and a declared port: port 0 is a random port nobody published. On verl the
    URL names the one gateway on the Ray head node (`proxy_gateway`), so it takes no per-worker "{port}";
    the TRL engine's processes on one machine take the declared port and the next ones ("{port}" allowed).
    `port` None: not checked (the SFT collection shards, whose proxies a site publishes itself).
    """
    if provider not in CLOUD_PROVIDERS:
        return None
    if not public_url:
        return (
            f"{provider} sandboxes reach the proxy over the internet, and its public URL is not set",
            f"{where}.public_url",
            "publish the proxy's declared port over HTTP(S) at one URL and set it (README, Using it for real)",
        )
    if port is not None and not port:
        return (
            f"{provider} sandboxes reach the proxy at a declared port, and port 0 picks a random one",
            f"{where}.port",
            "declare the port you publish, e.g. 8800 (the recipe's)",
        )
    if engine == "verl" and "{port}" in public_url:
        return (
            "verl runs one proxy endpoint per run (a gateway on the Ray head node): public_url takes no {port}",
            f"{where}.public_url",
            "set the URL at which the head node's declared port is published",
        )
    return None


def eval_reach_problem(
    provider: str, *, port: int | None, train_url: str | None, eval_url: str | None, engine: str | None
) -> tuple[str, str, str] | None:
    """`cloud_reach_problem` for an evaluation job's own proxy (on `train.proxy.port`, published at
    `evaluate.proxy_url`, else at `train.proxy.public_url`, which on verl names the Ray head's gateway: no
    evaluation job runs one)."""
    problem = cloud_reach_problem(provider, port=port, public_url=eval_url or train_url, engine="trl",
                                  where="train.proxy")  # fmt: skip
    if problem is None and provider in CLOUD_PROVIDERS and engine == "verl" and not eval_url:
        return ("the evaluation's cloud sandboxes need its own proxy published at a URL; on verl "
                "train.proxy.public_url names the Ray head's gateway, which an evaluation job does not run",
                "evaluate.proxy_url", "publish the evaluation node's train.proxy.port and set evaluate.proxy_url")  # fmt: skip
    return problem
