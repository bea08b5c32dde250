"""The smith stage functions without sandboxes: an LM key given by name reaches the endpoint and nothing
else; the dataset step keeps only tasks with an accepted statement, as a raw-schema parquet."""

from __future__ import annotations

import json

import pytest

from sweflow.errors import SmithError
from sweflow.offline.scripted_lm import ScriptedLM, offline_responder
from sweflow.sample import materialize_repo
from sweflow.smith.candidates import read_candidates, write_jsonl
from sweflow.smith.env import materialize_source
from sweflow.smith.gather import ROW_COLUMNS
from sweflow.smith.profile import load_profile
from sweflow.stages.smith import bug_candidates_step, smith_dataset_step
from sweflow.util import atomic_write_json

KEY = "sk-smith-test-0123456789abcdef0123456789"


def test_lm_key_by_name_reaches_the_endpoint_only(tmp_path, monkeypatch):
    monkeypatch.setenv("SMITH_TEST_LM_KEY", KEY)
    prof = load_profile("sample")
    src = materialize_source(prof, tmp_path / "repo.git")
    atomic_write_json(tmp_path / "env.json", {"ok": True, "profile": prof.to_dict(), **src})
    with ScriptedLM(offline_responder, api_key=KEY) as server:
        smith = {"seed": 0, "strategies": {"lm_modify": {"shards": 1, "max_candidates": 2}},
                 "lm": {"endpoint": server.url, "api": "openai", "model": "m", "api_key_env": "SMITH_TEST_LM_KEY"}}  # fmt: skip
        rep = bug_candidates_step("lm_modify", 0, tmp_path / "env.json", tmp_path / "repo.git",
                                  tmp_path / "c.jsonl", tmp_path / "c.report.json", smith=smith)  # fmt: skip
        assert len(server.requests) == 2
    assert rep["candidates"] == 2 and rep["skipped"] == []
    assert rep["lm"]["model"] == "m" and "api_key_env" not in json.dumps(rep["lm"])
    for f in (tmp_path / "c.jsonl", tmp_path / "c.report.json"):
        assert KEY not in f.read_text() and "SMITH_TEST_LM_KEY" not in f.read_text()
    # without the key, or with a wrong one, every request fails: an infrastructure fault (the job fails,
    # naming why), never a yield of 0 candidates; nothing is written and the key appears nowhere
    for value, why in ((None, "SMITH_TEST_LM_KEY (the LM API key) is not set"),
                       ("sk-wrong-key-0123456789abcdef\n", "HTTP 401"),
                       ("sk-bad\nkey", "holds spaces or control characters")):  # fmt: skip
        if value is None:
            monkeypatch.delenv("SMITH_TEST_LM_KEY")
        else:
            monkeypatch.setenv("SMITH_TEST_LM_KEY", value)
        with ScriptedLM(offline_responder, api_key=KEY) as server:
            smith["lm"]["endpoint"] = server.url
            with pytest.raises(SmithError, match="every LM request failed") as err:
                bug_candidates_step("lm_modify", 0, tmp_path / "env.json", tmp_path / "repo.git",
                                    tmp_path / "d.jsonl", tmp_path / "d.report.json", smith=smith)  # fmt: skip
        assert why in str(err.value) and "sk-" not in str(err.value)
        assert not (tmp_path / "d.jsonl").exists()


def test_dataset_keeps_tasks_with_an_accepted_statement(tmp_path):
    from sweflow.dataset.splits import load_split

    head = materialize_repo(tmp_path / "r").head
    base = {c: "" for c in ROW_COLUMNS} | {"repo": "sweflow/calclib", "version": "0.1", "base_commit": head,
                                           "FAIL_TO_PASS": ["tests/a.py::t"], "PASS_TO_PASS": []}  # fmt: skip
    rows = [base | {"instance_id": f"sweflow__calclib.{head[:8]}.procedural__0000000{i}", "patch": "p",
                    "bug_patch": "b", "strategy": "procedural", "meta": {}} for i in range(3)]  # fmt: skip
    write_jsonl(tmp_path / "tasks.jsonl", rows)
    statements = [
        {
            "instance_id": rows[0]["instance_id"],
            "problem_statement": "A clear issue text that is long enough.",
        },
        {"instance_id": rows[1]["instance_id"], "problem_statement": None, "rejected": [{"attempt": 1}]},
    ]
    write_jsonl(tmp_path / "st.jsonl", statements)
    rep = smith_dataset_step([tmp_path / "tasks.jsonl"], [tmp_path / "st.jsonl"], tmp_path / "train.parquet",
                             tmp_path / "report.json")  # fmt: skip
    assert rep["rows"] == 1 and {d["instance_id"] for d in rep["dropped"]} == {
        rows[1]["instance_id"], rows[2]["instance_id"]}  # fmt: skip
    instances, report = load_split(tmp_path / "train.parquet", split="train", shape="raw", expected_rows=1)
    assert instances[0]["problem_statement"].startswith("A clear issue") and report.rows == 1
    first = (tmp_path / "train.parquet").read_bytes()
    smith_dataset_step([tmp_path / "tasks.jsonl"], [tmp_path / "st.jsonl"], tmp_path / "train.parquet",
                       tmp_path / "report.json")  # fmt: skip
    assert (tmp_path / "train.parquet").read_bytes() == first  # byte-stable


def test_combine_shards_hold_whole_modules(tmp_path):
    from sweflow.smith.gitrepo import checkout, source_files
    from sweflow.smith.procedural import procedural_candidates

    prof = load_profile("sample")
    src = materialize_source(prof, tmp_path / "repo.git")
    atomic_write_json(tmp_path / "env.json", {"ok": True, "profile": prof.to_dict(), **src})
    tree = checkout(tmp_path / "repo.git", src["commit"], tmp_path / "tree")
    cands = procedural_candidates(tree, source_files(tree), repo=prof.repo, commit=src["commit"], seed=0,
                                  max_candidates=6)  # fmt: skip
    assert len({c.files[0] for c in cands}) > 1  # several files, one module (calclib/)
    write_jsonl(tmp_path / "cands.jsonl", (c.to_dict() for c in cands))
    write_jsonl(tmp_path / "val.jsonl", ({"instance_id": c.instance_id, "status": "kept"} for c in cands))

    def run(shard, shards):
        opts = {"shards": shards, "by": "module", "max_combos": 3, "min_bugs": 2, "max_bugs": 2}
        out = tmp_path / f"c-{shard}-{shards}.jsonl"
        bug_candidates_step("combine", shard, tmp_path / "env.json", tmp_path / "repo.git", out,
                            tmp_path / f"r-{shard}-{shards}.json", smith={"seed": 0, "strategies": {"combine": opts}},
                            validated=[tmp_path / "val.jsonl"], validated_candidates=[tmp_path / "cands.jsonl"])  # fmt: skip
        return {c.instance_id for c in read_candidates(out)}

    whole = run(0, 1)
    parts = [run(0, 3), run(1, 3), run(2, 3)]
    assert whole and sorted(map(len, parts)) == [0, 0, len(whole)] and set().union(*parts) == whole
