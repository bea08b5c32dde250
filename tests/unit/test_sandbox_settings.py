"""SandboxSettings: built from the validated `sandbox` section (schema defaults), carried through a spec."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from sweflow.config import load_config
from sweflow.errors import ConfigError
from sweflow.sandbox.settings import (
    DockerSettings,
    E2BSettings,
    LocalSettings,
    NetworkSettings,
    SandboxSettings,
)
from sweflow.schema import defaults, schema
from tests.integration.conftest import ROOT

SECTIONS = {"local": LocalSettings, "docker": DockerSettings, "e2b": E2BSettings, "network": NetworkSettings}


def test_every_schema_key_of_sandbox_is_a_field():
    props = schema()["properties"]["sandbox"]["properties"]
    assert [f.name for f in fields(SandboxSettings)] == list(props)
    for name, kind in SECTIONS.items():
        assert [f.name for f in fields(kind)] == list(props[name]["properties"]), name


def test_built_from_the_embedded_default_it_is_the_validated_section():
    cfg = load_config(ROOT / "config" / "config.yaml")
    s = SandboxSettings.from_config(cfg["sandbox"])
    # JSON-equal to the section (the verl rollout spec and the TRL ranks' spec keep their bytes)
    assert json.dumps(s.to_spec(), sort_keys=True) == json.dumps(cfg["sandbox"], sort_keys=True)
    assert s.provider == "local" and s.packages == tuple(cfg["sandbox"]["packages"])
    assert s.local.templates_root == cfg["sandbox"]["local"]["templates_root"]
    assert SandboxSettings.from_spec(s.to_spec()) == s


def test_a_partial_section_takes_the_schema_defaults_but_no_templates_root():
    s = SandboxSettings.from_config({"docker": {"cpus": 1.5}, "network": {"eval": "internet"}})
    assert s.docker == DockerSettings(**{**defaults("sandbox.docker"), "cpus": 1.5})
    assert (
        s.network.eval == "internet"
        and s.network.docker_network == defaults("sandbox.network")["docker_network"]
    )
    assert s.build_attempts == defaults("sandbox")["build_attempts"]
    # the provider's own folder, not the workflow's relative default
    assert s.local.templates_root is None
    assert s.local.limits().pids == defaults("sandbox.local")["pids_limit"]
    assert SandboxSettings.from_spec(s.to_spec()) == s


@pytest.mark.parametrize("change", [("drop", None, "prebuilt"), ("add", None, "typo"), ("drop", "docker", "cpus"),
                                    ("add", "network", "eval_repo")])  # fmt: skip
def test_a_spec_missing_or_adding_a_key_is_refused(change):
    how, section, key = change
    spec = SandboxSettings.from_config({}).to_spec()
    target = spec[section] if section else spec
    if how == "drop":
        del target[key]
    else:
        target[key] = 1
    with pytest.raises(ConfigError, match=key):
        SandboxSettings.from_spec(spec, where="spec.json: sandbox")
