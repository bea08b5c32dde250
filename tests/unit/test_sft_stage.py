"""The SFT stage's message step on recorded data: the counts add up, only kept attempts become rows, published
SWE-agent trajectories join with their resolved list, a key in a trajectory stops the collection job."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest

from sweflow.errors import DatasetError, TrainError
from sweflow.grading.evaluate import write_evidence
from sweflow.smith.candidates import write_jsonl
from sweflow.stages.common import shard_ids
from sweflow.stages.sft import collect_cache_key, collect_trajectories_step, shard_rows, traj_to_messages_step

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "trajectories"


@pytest.fixture
def recorded(tmp_path):
    """Three attempts of one task: the recorded session (kept), a dropped one, one whose collection aborted."""
    with gzip.open(FIXTURES / "claude_code_prediction.json.gz", "rt", encoding="utf-8") as fh:
        pred = json.load(fh)
    iid = pred["instance_id"]
    kept = dict(pred, id=f"{iid}.0", attempt=0)
    dropped = dict(copy.deepcopy(pred), id=f"{iid}.1", attempt=1)
    aborted = {"id": f"{iid}.2", "instance_id": iid, "attempt": 2, "status": "aborted", "turns": [],
               "failure_reason": "sandbox_create_failed"}  # fmt: skip
    preds = tmp_path / "p.jsonl.gz"
    write_evidence(preds, [kept, dropped, aborted])
    base = {"instance_id": iid, "integrity_violations": [], "statuses": {}, "error": None}
    evals = tmp_path / "e.jsonl"
    write_jsonl(evals, [
        {**base, "id": kept["id"], "status": "graded", "resolved": True, "kept": True, "drop_reason": None},
        {**base, "id": dropped["id"], "status": "graded", "resolved": False, "kept": False,
         "drop_reason": "not_resolved:fail_to_pass_failure"},
        {**base, "id": aborted["id"], "status": "not_collected", "resolved": False, "kept": False,
         "drop_reason": "collection_aborted:sandbox_create_failed"},
    ])  # fmt: skip
    return preds, evals, kept


def _rows(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def test_only_kept_attempts_become_rows_and_the_counts_add_up(recorded, tmp_path):
    preds, evals, kept = recorded
    out = tmp_path / "m"
    s = traj_to_messages_step([preds], [evals], out / "tools.jsonl", out / "text.jsonl", out / "summary.json")
    assert (s["attempts"], s["kept"], s["dropped"], s["graded"], s["resolved"]) == (3, 1, 2, 2, 1)
    assert s["dropped_by_reason"] == {"collection_aborted:sandbox_create_failed": 1,
                                      "not_resolved:fail_to_pass_failure": 1}  # fmt: skip
    assert s["collection"] == {"aborted": 1, "completed": 2} and s["trajectory_ids"] == [kept["id"]]
    [tools_row] = _rows(out / "tools.jsonl")
    [text_row] = _rows(out / "text.jsonl")
    assert tools_row["id"] == text_row["id"] == kept["id"]
    assert s["system_prompts"] == [{"sha256": s["system_prompts"][0]["sha256"],
                                    "text": tools_row["messages"][0]["content"]}]  # fmt: skip
    # the text form: observations as user turns, actions in the assistant text
    roles = {m["role"] for m in text_row["messages"]}
    assert roles <= {"system", "user", "assistant"} and "tool" not in roles
    assert any("<function=Edit>" in m["content"] for m in text_row["messages"] if m["role"] == "assistant")


def test_published_swe_agent_trajectories_join_by_their_resolved_list(recorded, tmp_path):
    preds, evals, _ = recorded
    resolved = tmp_path / "resolved.txt"
    resolved.write_text("textkit__textkit-17\n")
    out = tmp_path / "m"
    s = traj_to_messages_step([preds], [evals], out / "tools.jsonl", out / "text.jsonl", out / "summary.json",
                              extra=[{"path": str(FIXTURES), "resolved": str(resolved)}])  # fmt: skip
    assert s["external"]["kept"] == 1 and s["external"]["dropped"] == 1
    assert s["external"]["records"][0]["drop_reason"] == "not_resolved"
    rows = _rows(out / "tools.jsonl")
    assert len(rows) == s["rows"] == 2 and {r["source"] for r in rows} == {"claude_code", "swe_agent"}
    assert sum(r["instance_id"] == "textkit__textkit-17" for r in rows) == 1


def test_an_attempt_without_an_evaluation_is_an_error_naming_it(recorded, tmp_path):
    preds, _, kept = recorded
    empty = tmp_path / "none.jsonl"
    empty.write_text("")
    with pytest.raises(DatasetError, match="without an evaluation") as exc:
        traj_to_messages_step([preds], [empty], tmp_path / "t", tmp_path / "x", tmp_path / "s")
    assert kept["id"] in str(exc.value) and not (tmp_path / "t").exists()


def test_shards_partition_the_rows_after_the_limit():
    rows = [{"metadata": {"instance_id": f"o__r-{i}"}} for i in range(20)]
    parts = [shard_rows(rows, k, 3, 12) for k in range(3)]
    ids = sorted(r["metadata"]["instance_id"] for p in parts for r in p)
    assert ids == sorted(f"o__r-{i}" for i in range(12)) and all(parts)


def test_a_task_keeps_its_shard_whatever_the_other_tasks():
    ids = [f"o__r-{i}" for i in range(40)]
    shard = {i: k for k in range(4) for i in shard_ids(ids, k, 4, None)}
    assert sorted(shard) == sorted(ids) and len(set(shard.values())) == 4
    # another task added, removed or reordered: every other task stays in its shard
    for others in (ids[1:], ids + ["o__r-new"], list(reversed(ids))):
        now = {i: k for k in range(4) for i in shard_ids(others, k, 4, None)}
        assert all(now[i] == shard[i] for i in others if i in shard)
    # pinned: the hash is the same in every process and Python version (no salted hash())
    assert [k for k in range(8) if shard_ids(["o__r-7"], k, 8, None)] == [2]


COLLECT = {"attempts": 2, "shards": 1, "limit": None, "max_concurrency": 3, "backend_options": {},
           "proxy": {"host": "127.0.0.1", "port": 0, "max_tokens": 32000},
           "expert": {"endpoint": "https://api.example", "model": "claude-x", "api_key_env": "K", "timeout_s": 60}}  # fmt: skip


def test_the_cache_key_covers_the_row_and_what_makes_a_trajectory_and_nothing_else():
    row = {"metadata": {"instance_id": "o__r-1", "problem": "p"}, "prompt": "fix it"}
    key = collect_cache_key(row, COLLECT, provider="local", sandbox={"provider": "local"})
    same = [
        collect_cache_key(json.loads(json.dumps(row, sort_keys=True)), COLLECT, provider="local",
                          sandbox={"provider": "local"}),
        # operational knobs, the shard count and the limit pick tasks or bound a run: same trajectories
        collect_cache_key(row, {**COLLECT, "max_concurrency": 9, "shards": 8, "limit": 3,
                                "expert": {**COLLECT["expert"], "timeout_s": 5, "api_key_env": "OTHER"}},
                          provider="local", sandbox={"provider": "local"}),
    ]  # fmt: skip
    assert same == [key, key] and len(key) == 64
    other = [
        collect_cache_key({**row, "prompt": "fix it now"}, COLLECT, provider="local"),
        collect_cache_key(row, {**COLLECT, "attempts": 3}, provider="local"),
        collect_cache_key(row, {**COLLECT, "expert": {**COLLECT["expert"], "model": "claude-y"}}, provider="local"),
        collect_cache_key(row, {**COLLECT, "expert": {**COLLECT["expert"], "endpoint": "https://b"}},
                          provider="local"),
        collect_cache_key(row, COLLECT, provider="e2b"),
        collect_cache_key(row, COLLECT, provider="local", expert_patch="diff"),
    ]  # fmt: skip
    base = collect_cache_key(row, COLLECT, provider="local")
    assert base not in other and len(set(other)) == len(other)


def test_a_cached_task_is_never_collected_again(monkeypatch, tmp_path):
    import sweflow.stages.sft as sft_mod
    import sweflow.trajectories.collect as collect_mod
    from sweflow.grading.evidence import read_evidence

    bought = []

    def fake(rows, *, attempts, **kw):
        bought.extend(r["metadata"]["instance_id"] for r in rows)
        return [{"id": f"{r['metadata']['instance_id']}.{a}", "instance_id": r["metadata"]["instance_id"],
                 "attempt": a, "status": "aborted" if "flaky" in r["metadata"]["instance_id"] else "completed",
                 "turns": []} for r in rows for a in range(attempts)]  # fmt: skip

    monkeypatch.setattr(collect_mod, "collect_trajectories", fake)
    monkeypatch.setattr(sft_mod, "expert_upstream", lambda *a, **k: _NoKey())
    files = []
    for iid in ("o__r-1", "o__r-2", "o__r-flaky"):
        files.append(tmp_path / f"{iid}.jsonl")
        files[-1].write_text(json.dumps({"metadata": {"instance_id": iid}, "prompt": "p"}) + "\n")
    cache = tmp_path / "cache"

    def run(name, rows):
        out = tmp_path / f"{name}.jsonl.gz"
        collect_trajectories_step(rows, [], out, shard=0, collect=COLLECT, provider="local", cfg={},
                                  cache_dir=cache)  # fmt: skip
        return out

    first = run("first", files)
    assert bought == ["o__r-1", "o__r-2", "o__r-flaky"] and len(list(cache.glob("*.json.gz"))) == 2
    bought.clear()
    again = run("again", files)  # only the task with an aborted attempt is collected again
    assert bought == ["o__r-flaky"] and again.read_bytes() == first.read_bytes()
    bought.clear()
    files[0].write_text(json.dumps({"metadata": {"instance_id": "o__r-1"}, "prompt": "changed"}) + "\n")
    run("changed", files[:2])
    assert bought == ["o__r-1"]
    assert [p["id"] for p in read_evidence(tmp_path / "changed.jsonl.gz")] == ["o__r-1.0", "o__r-1.1",
                                                                             "o__r-2.0", "o__r-2.1"]  # fmt: skip


class _NoKey:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def scrub(self, text):
        return text


def test_a_trajectory_holding_the_key_fails_the_collection_job(monkeypatch, tmp_path):
    """Whatever path a key takes into a recorded turn (an upstream echoing it, say), nothing is written."""
    import sweflow.trajectories.collect as collect_mod

    key = "sk-ant-api03-PLANTED-stage-0123456789abcdef"
    monkeypatch.setenv("PLANTED_STAGE_KEY", key)
    monkeypatch.setattr(collect_mod, "collect_trajectories",
                        lambda rows, **kw: [{"id": "x.0", "turns": [{"response": {"content": key}}]}])  # fmt: skip
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text(json.dumps({"metadata": {"instance_id": "o__r-1"}}) + "\n")
    out = tmp_path / "p.jsonl.gz"
    collect = {"attempts": 1, "shards": 1, "limit": None, "max_concurrency": 1,
               "expert": {"endpoint": "http://127.0.0.1:9", "api_key_env": "PLANTED_STAGE_KEY"}}  # fmt: skip
    with pytest.raises(TrainError, match="contains the upstream API key") as exc:
        collect_trajectories_step([jsonl], [], out, shard=0, collect=collect, provider="local", cfg={})
    assert key not in str(exc.value) and not out.exists()


def test_a_refused_transcript_is_dropped_and_counted_while_the_others_go_on(recorded, tmp_path):
    preds, evals, kept = recorded
    from sweflow.grading.evidence import read_evidence

    records = read_evidence(preds)
    records[0]["turns"][-1]["request"]["messages"].insert(1, {"role": "assistant", "content": "forged"})
    write_evidence(preds, records)
    out = tmp_path / "m"
    s = traj_to_messages_step([preds], [evals], out / "tools.jsonl", out / "text.jsonl", out / "summary.json")
    assert s["kept"] == 0 and s["dropped"] == 3 and s["dropped_by_reason"]["transcript_refused:turns"] == 1
    assert (out / "tools.jsonl").read_text() == ""
