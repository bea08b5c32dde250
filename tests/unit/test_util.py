"""The shared secret handling: names that look secret, values from the environment, token shapes, logs."""

from __future__ import annotations

import logging

import pytest

from sweflow.util import is_secret_key, redact, secret_values, setup_logging


@pytest.mark.parametrize("name", ["HF_TOKEN", "api_key", "E2B_API_KEY", "anthropicAuthToken", "db_password"])
def test_secret_looking_names(name):
    assert is_secret_key(name)


@pytest.mark.parametrize("name", ["max_tokens", "tokenizer", "image_key", "instance_key", "author", "keys"])
def test_ordinary_names_are_not_secret(name):
    assert not is_secret_key(name)


def test_secret_values_come_from_secret_names_only():
    env = {
        "HF_TOKEN": "hf_value_long_enough",
        "TOKENIZERS_PARALLELISM": "false-but-long",
        "PATH": "/usr/bin:/bin",
    }
    assert secret_values(env) == ["hf_value_long_enough"]


def test_redact_removes_env_values_and_token_shaped_strings():
    text = "key=PLANTED-VALUE-123 and hf_" + "a" * 30 + " and sk-ant-" + "b" * 24
    out = redact(text, ["PLANTED-VALUE-123"])
    assert "PLANTED" not in out and "hf_aaa" not in out and "sk-ant-bbb" not in out
    assert out.count("***REDACTED***") == 3


def test_logs_are_redacted(tmp_path, monkeypatch):
    monkeypatch.setenv("SWEFLOW_TEST_API_KEY", "planted-secret-value")
    log_file = tmp_path / "rule.log"
    setup_logging(log_file)
    logging.getLogger("sweflow.test").info("calling with %s and ghp_%s", "planted-secret-value", "c" * 36)
    logging.shutdown()
    text = log_file.read_text()
    assert "planted-secret-value" not in text and "ghp_ccc" not in text and "***REDACTED***" in text
