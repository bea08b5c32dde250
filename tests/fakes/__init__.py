"""Local fakes for external services, so tests drive the real client SDKs offline.

`FakeE2B` starts the fake E2B control plane and the fake envd on 127.0.0.1 and gives the
connection settings (`api_params()` for explicit kwargs, `env()` for E2B_* variables) that point
the real e2b SDK at them. `anthropic_stub.AnthropicStub` is a scripted Anthropic Messages API that the
real Claude Code CLI talks to.
"""

from __future__ import annotations

from typing import Any

from .e2b_control import FakeControlPlane
from .e2b_envd import FakeEnvd

FAKE_API_KEY = "e2b_test_SECRET_0123456789abcdef"


class FakeE2B:
    """Both E2B fakes together; a context manager."""

    def __init__(self, *, api_key: str = FAKE_API_KEY, templates: tuple[str, ...] = ("base",)) -> None:
        self.api_key = api_key
        self.envd = FakeEnvd()
        self.control = FakeControlPlane(self.envd, api_key=api_key, templates=templates)

    def start(self) -> FakeE2B:
        self.envd.start()
        self.control.start()
        return self

    def stop(self) -> None:
        self.control.stop()
        self.envd.stop()

    def __enter__(self) -> FakeE2B:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """Environment variables that point the SDK at the fakes."""
        return {
            "E2B_API_KEY": self.api_key,
            "E2B_API_URL": self.control.url,
            "E2B_SANDBOX_URL": self.envd.url,
            "E2B_DOMAIN": "fake.e2b.test",
        }

    def api_params(self) -> dict[str, Any]:
        """The same settings as SDK keyword arguments (ApiParams)."""
        return {
            "api_key": self.api_key,
            "api_url": self.control.url,
            "sandbox_url": self.envd.url,
            "domain": "fake.e2b.test",
        }


__all__ = ["FAKE_API_KEY", "FakeControlPlane", "FakeE2B", "FakeEnvd"]
