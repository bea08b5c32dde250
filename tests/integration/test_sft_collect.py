"""Expert trajectories for real: Claude Code in a local (bubblewrap) sandbox, its model calls through the
proxy's pass-through mode to the scripted expert (a local Anthropic endpoint that demands a planted key),
every patch graded in a fresh sandbox, the kept trajectories turned into messages.

One sample task, three attempts with three behaviours (gold, wrong fix, gold plus a test edit): exactly the
gold attempt is kept, the counts add up, and the planted key appears in no file, no log line, no record.
"""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import sys
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from sweflow.util import jsonl_line  # noqa: E402
from tests.integration.test_e2e_check import CLAUDE, INSTANCE, task, training_row  # noqa: E402, F401

PLANTED = "sk-ant-api03-PLANTED-sft-collect-4f1e2d3c4b5a69788796a5b4c3d2e1f0"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.claude,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
]


@pytest.fixture(scope="module")
def task_files(task):  # noqa: F811 - the e2e check's fixture
    """A local template of the e2e check's sample task, its training row (JSONL) and its split parquet."""
    if CLAUDE is None:
        pytest.skip("Claude Code CLI not found")
    from sweflow.sample import write_parquet
    from sweflow.sandbox.build import build_and_record
    from sweflow.sandbox.local import LocalProvider
    from sweflow.sandbox.spec import TemplateSpec

    tmp, inst = task["tmp"], task["inst"]
    image = f"sweflow-sample/{INSTANCE}:latest"
    rec = build_and_record(
        LocalProvider(tmp / "templates"), image, tmp / "record.json",
        spec=TemplateSpec(image=image, claude_binary=task["paths"]["claude"]),
        attempts=1, repo=task["repo"].path, commit=inst["base_commit"],
    )  # fmt: skip
    assert rec["ok"], rec
    jsonl = tmp / "tasks.valid.jsonl"
    jsonl.write_text(jsonl_line(training_row(task, rec["template"], "local")))
    parquet = tmp / "train.parquet"
    write_parquet([inst], parquet)
    return {"tmp": tmp, "jsonl": jsonl, "parquet": parquet, "templates": tmp / "templates"}


def _all_text(root: Path) -> str:
    out = []
    for f in sorted(root.rglob("*")):
        if not f.is_file():
            continue
        data = f.read_bytes()
        if f.suffix == ".gz":
            data = gzip.decompress(data)
        out.append(data.decode("utf-8", "replace"))
    return "\n".join(out)


def test_expert_attempts_are_graded_and_only_the_clean_resolved_one_is_kept(task_files, tmp_path, monkeypatch,
                                                                            caplog):  # fmt: skip
    from sweflow.stages.sft import collect_trajectories_step, evaluate_predictions_step, traj_to_messages_step

    monkeypatch.setenv("SWEFLOW_PLANTED_KEY", PLANTED)
    caplog.set_level(logging.DEBUG)
    cfg = {"local": {"templates_root": str(task_files["templates"])}}
    collect = {
        "attempts": 3, "shards": 1, "limit": None, "max_concurrency": 3, "backend_options": {},
        "expert": {"endpoint": "scripted", "api_key_env": "SWEFLOW_PLANTED_KEY", "model": "claude-sonnet-4-5",
                   "timeout_s": 120, "attempts": 2, "plan": ["gold", "wrong_fix", "test_edit"]},
    }  # fmt: skip
    out = tmp_path / "out"
    preds = out / "predictions.jsonl.gz"
    counts = collect_trajectories_step([task_files["jsonl"]], [("train", task_files["parquet"])], preds,
                                       shard=0, collect=collect, provider="local", cfg=cfg)  # fmt: skip
    assert counts == {"tasks": 1, "attempts": 3, "completed": 3}, counts
    from sweflow.grading.evidence import read_evidence
    from sweflow.offline.expert import behaviour_for

    records = read_evidence(preds)
    plan = collect["expert"]["plan"]
    behaviour = {r["id"]: behaviour_for(plan, INSTANCE, r["attempt"]) for r in records}
    assert sorted(behaviour.values()) == sorted(plan)
    # the upstream model was forced, and the recorded turns hold the whole exchange
    for r in records:
        assert r["turns"] and all(t["request"]["model"] for t in r["turns"])
        assert {t["response"]["model"] for t in r["turns"]} == {"claude-sonnet-4-5"}

    evals = out / "evaluations.jsonl"
    evaluate_predictions_step(preds, [task_files["jsonl"]], evals, out / "evidence.jsonl.gz", provider="local",
                              cfg=cfg)  # fmt: skip
    verdicts = {json.loads(line)["id"]: json.loads(line) for line in evals.read_text().splitlines()}
    by_behaviour = {behaviour[i]: v for i, v in verdicts.items()}
    assert by_behaviour["gold"]["kept"] and by_behaviour["gold"]["resolved"]
    assert by_behaviour["wrong_fix"]["drop_reason"] == "not_resolved:fail_to_pass_failure"
    assert not by_behaviour["wrong_fix"]["resolved"] and by_behaviour["wrong_fix"]["status"] == "graded"
    assert by_behaviour["test_edit"]["drop_reason"] == "integrity_violation:test_edit"
    assert not by_behaviour["test_edit"]["kept"]

    summary = traj_to_messages_step(
        [preds], [evals], out / "tools.jsonl", out / "text.jsonl", out / "summary.json"
    )
    assert (summary["attempts"], summary["kept"], summary["dropped"]) == (3, 1, 2)
    assert summary["dropped_by_reason"] == {
        "integrity_violation:test_edit": 1,
        "not_resolved:fail_to_pass_failure": 1,
    }
    gold_id = next(i for i, b in behaviour.items() if b == "gold")
    assert summary["trajectory_ids"] == [gold_id]
    [row] = [json.loads(line) for line in (out / "tools.jsonl").read_text().splitlines()]
    assert row["id"] == gold_id and row["messages"][0]["role"] == "system"
    assert any(m.get("tool_calls") for m in row["messages"]) and row["tools"]
    assert summary["system_prompts"][0]["text"] == row["messages"][0]["content"]
    [text_row] = [json.loads(line) for line in (out / "text.jsonl").read_text().splitlines()]
    assert all(m["role"] in ("system", "user", "assistant") for m in text_row["messages"])

    # the planted key reached the expert (it answers 401 without it) but no file and no log line
    assert PLANTED not in _all_text(out)
    assert PLANTED not in caplog.text
