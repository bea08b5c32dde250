"""provider_from_config: one place turns the `sandbox` settings into a provider, per purpose."""

from __future__ import annotations

import pytest

from sweflow.sandbox import registry
from sweflow.sandbox.limits import LimitSpec
from sweflow.sandbox.settings import SandboxSettings

CFG = SandboxSettings.from_config(
    {
        "local": {"templates_root": "/tmp/templates", "pids_limit": 77, "mem_mb": 1024, "scratch_mb": 0},
        "docker": {"cpus": 3, "mem_mb": 2048, "pids_limit": 99, "file_size_mb": 512, "disk_mb": 0},
        "network": {"docker_network": "evalnet"},
    }
)
EMPTY = SandboxSettings.from_config({})


class Made:
    internet_network = "bridge"

    def __init__(self, name, **options):
        self.name, self.options = name, options


@pytest.fixture
def made(monkeypatch):
    monkeypatch.setattr(registry, "get_provider", lambda name, **options: Made(name, **options))


@pytest.mark.parametrize(
    ("purpose", "server"),
    [("run", {}), ("build", {"start_server": False}), ("eval", {"start_server": False})],
)
def test_local_and_docker_options_come_from_their_sections(made, purpose, server):
    local = registry.provider_from_config("local", CFG, purpose=purpose)
    docker = registry.provider_from_config("docker", CFG, purpose=purpose)
    limits = LimitSpec(pids=77, memory_mb=1024, file_size_mb=2048, scratch_mb=0)
    assert local.options == {"templates_root": "/tmp/templates", "limits": limits, **server}
    assert docker.options == {
        "cpu": 3, "memory_mb": 2048, "pids_limit": 99, "file_size_mb": 512, "disk_mb": 0, **server
    }  # fmt: skip


def test_only_fresh_evaluations_join_the_configured_docker_network(made):
    assert registry.provider_from_config("docker", CFG, purpose="eval").internet_network == "evalnet"
    assert registry.provider_from_config("docker", CFG, purpose="run").internet_network == "bridge"
    assert registry.provider_from_config("docker", EMPTY, purpose="eval").internet_network == "bridge"


def test_defaults_and_other_providers(made):
    docker = registry.provider_from_config("docker", EMPTY)
    assert docker.options == {
        "cpu": 2,
        "memory_mb": 4096,
        "pids_limit": 1024,
        "file_size_mb": 2048,
        "disk_mb": 8192,
    }
    assert registry.provider_from_config("local", EMPTY).options == {
        "templates_root": None,
        "limits": LimitSpec(),
    }
    assert registry.provider_from_config("e2b", CFG, purpose="eval").options == {}
