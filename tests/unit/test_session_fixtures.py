"""The recorded Claude Code sessions of tests/fixtures/sessions keep the shape token-building measurements
rely on: what Claude Code sent each turn (system, tools, messages), growing turn by turn, every tool call
answered in the next request. See tests/fixtures/sessions/README.md for how they were recorded.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sweflow.errors import DatasetError
from sweflow.offline.policies import gold_edits
from sweflow.rollout.e2e import POLICIES
from sweflow.sample import sample_rows

SESSIONS = Path(__file__).resolve().parents[1] / "fixtures" / "sessions"
FILES = sorted(SESSIONS.glob("*.json.gz"))


def _load(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def _has_gold(instance_id: str) -> bool:
    try:
        return bool(gold_edits(instance_id))
    except DatasetError:
        return False


def test_every_sample_task_with_a_gold_fix_has_both_policies_recorded():
    want = {f"{r['instance_id']}.{p}.json.gz" for r in sample_rows("train") if _has_gold(r["instance_id"]) for p in POLICIES}  # fmt: skip
    assert want and want <= {f.name for f in FILES}
    assert sum(f.stat().st_size for f in FILES) < 1_000_000, "keep the fixtures small"


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_a_recorded_session_has_the_shape_token_building_reads(path):
    rec = _load(path)
    assert path.name.startswith(f"{rec['instance_id']}.{rec['policy']}.")
    assert rec["policy"] in POLICIES and rec["claude_version"]
    expected_reward = 1.0 if rec["policy"] == "gold" else 0.0
    assert (rec["outcome"]["status"], rec["outcome"]["reward"]) == ("completed", expected_reward)
    turns = rec["turns"]
    assert len(turns) == rec["outcome"]["num_turns"] >= 3
    assert [t["index"] for t in turns] == list(range(len(turns)))
    prev = None
    for turn in turns:
        req, resp = turn["request"], turn["response"]
        assert set(req) >= {"model", "system", "tools", "messages"}
        assert req["system"] and all(b["type"] == "text" for b in req["system"])
        assert {"Read", "Edit", "Write"} <= {t["name"] for t in req["tools"]}
        assert req["messages"][0]["role"] == "user" and resp["content"] and not turn["aborted"]
        if prev is not None:
            before, now = prev["request"]["messages"], req["messages"]
            assert len(now) > len(before), f"turn {turn['index']}: the conversation did not grow"
            assert [m["role"] for m in now[: len(before)]] == [m["role"] for m in before]
            assert now[len(before)]["role"] == "assistant"
            calls = [b["id"] for b in prev["response"]["content"] if b["type"] == "tool_use"]
            answered = [
                b["tool_use_id"]
                for m in now[len(before) + 1 :]
                if isinstance(m["content"], list)
                for b in m["content"]
                if b["type"] == "tool_result"
            ]
            assert calls == answered, f"turn {turn['index']}: tool calls of the previous answer unanswered"
        prev = turn
    assert turns[-1]["stop_reason"] == "end_turn"
    assert all(t["stop_reason"] == "tool_use" for t in turns[:-1])
    text = json.dumps(rec)
    assert "Bearer " not in text and "sk-ant-" not in text
