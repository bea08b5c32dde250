"""Shared fixtures of the unit tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def harness():
    """The harness the convert step loads for the sample (swebench 4.x with the calclib repo registered).
    Modules that need another one define their own `harness` fixture, which takes precedence."""
    pytest.importorskip("swebench", reason="swebench 4.x is the harness the tests run against")
    from sweflow.stages import data

    return data.harness_from_config("swebench", "sample")
