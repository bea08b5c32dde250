"""ProxySettings: built from the validated `train.proxy` (schema defaults), carried through a rollout spec."""

from __future__ import annotations

from dataclasses import fields

import pytest

from sweflow.config import load_config
from sweflow.errors import ConfigError
from sweflow.schema import defaults
from sweflow.train.proxy_settings import ProxySettings
from tests.integration.conftest import ROOT


def test_every_schema_key_of_train_proxy_is_a_field():
    assert {f.name for f in fields(ProxySettings)} == set(defaults("train.proxy", {}))


def test_built_from_the_embedded_default_and_back_through_a_spec():
    cfg = load_config(ROOT / "config" / "config.yaml")
    s = ProxySettings.from_config(cfg["train"])
    want = defaults("train.proxy", cfg["train"].get("proxy"))
    assert s.to_spec() == {k: want[k] for k in s.to_spec()}
    assert list(s.to_spec()) == ["host", "port", "public_url", "build_mode", "build_model"]  # spec bytes
    assert ProxySettings.from_spec(s.to_spec()) == s
    fixed = ProxySettings.from_config({"proxy": {"port": 9000}})
    assert (fixed.port_for_rank(0), fixed.port_for_rank(3), s.port_for_rank(3)) == (9000, 9003, 0)


@pytest.mark.parametrize("change", [{"drop": "build_mode"}, {"add": "typo_port"}])
def test_a_spec_missing_or_adding_a_key_is_refused(change):
    spec = ProxySettings.from_config({}).to_spec()
    if "drop" in change:
        del spec[change["drop"]]
    else:
        spec[change["add"]] = 1
    with pytest.raises(ConfigError, match=change.get("drop") or change.get("add")):
        ProxySettings.from_spec(spec, where="spec.json: proxy")
