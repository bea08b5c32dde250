"""Identifier validators refuse a trailing newline (``$`` matches before one; the patterns end in ``\\Z``)."""

from __future__ import annotations

import pytest

from sweflow.blackbox.sessions import ID_RE
from sweflow.dataset.hub_client import SHA_RE
from sweflow.dataset.splits import INSTANCE_ID_RE, check_instance
from sweflow.offline.hub_store import _FULL_SHA, _REPO_ID
from sweflow.proxy.handler import SESSION_ID_RE
from sweflow.sandbox.ledger import _CONTAINER_ID
from sweflow.smith.lm import _ENV_NAME

GOOD = {
    INSTANCE_ID_RE: "psf__requests-1142",
    ID_RE: "session-1",
    SESSION_ID_RE: "session-1",
    SHA_RE: "a" * 40,
    _FULL_SHA: "b" * 40,
    _REPO_ID: "owner/name",
    _CONTAINER_ID: "0123456789ab",
    _ENV_NAME: "OPENAI_API_KEY",
}


@pytest.mark.parametrize("pattern", list(GOOD), ids=lambda p: p.pattern[:30])
def test_a_valid_id_matches_and_the_same_id_with_a_newline_does_not(pattern):
    assert pattern.match(GOOD[pattern])
    assert not pattern.match(GOOD[pattern] + "\n")


def test_a_row_whose_instance_id_ends_in_a_newline_is_named():
    row = {
        "instance_id": "psf__requests-1142\n",
        "repo": "psf/requests",
        "base_commit": "a" * 40,
        "version": "2.0",
        "problem_statement": "x",
        "patch": "",
        "test_patch": "",
        "FAIL_TO_PASS": ["t"],
        "PASS_TO_PASS": [],
    }
    _, problems = check_instance(row, index=3)
    assert [(p.field, p.row) for p in problems] == [("instance_id", 3)], problems
