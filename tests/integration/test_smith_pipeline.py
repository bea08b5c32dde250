"""The embedded default's SWE-smith branch (read from the session's embedded run, tests/integration/conftest.py):
the sample repository -> candidates of every strategy -> validated -> gathered -> statements -> the
smith-calclib dataset, which the data stage converted and validated like any split."""

from __future__ import annotations

import json
import re

import pytest

from sweflow.sample import materialize_repo
from sweflow.smith.statements import leaks
from sweflow.util import read_json

pytestmark = [pytest.mark.integration, pytest.mark.claude]

STRATEGIES = ("procedural", "lm_modify", "lm_rewrite", "pr_mirror", "combine")


def _jsonl(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_every_strategy_yields_validated_tasks(embedded_local_run, tmp_path):
    work = embedded_local_run
    env = read_json(work / "results/smith/calclib/env.json")
    head = materialize_repo(tmp_path / "r").head
    assert env["ok"] and env["commit"] == head and env["reference"]["tests"] == 55
    summary = read_json(work / "results/smith/calclib/summary.json")
    assert summary["repository_ok"] and summary["errors"] == []
    assert set(summary["strategies"]) == set(STRATEGIES)
    for name, counts in summary["strategies"].items():
        assert counts.get("kept", 0) >= 1, (name, counts)
        assert sum(v for k, v in counts.items() if k not in ("candidates", "yield")) == counts["candidates"]
    tasks = _jsonl(work / "results/smith/calclib/tasks.jsonl")
    assert len(tasks) == summary["tasks"] == sum(c.get("kept", 0) for c in summary["strategies"].values())
    id_re = re.compile(rf"sweflow__calclib\.{head[:8]}\.({'|'.join(STRATEGIES)})__[0-9a-f]{{8}}")
    assert all(id_re.fullmatch(t["instance_id"]) for t in tasks)
    # every kept report of every shard is a task, and every report names its outcome
    reports = [r for p in (work / "results/smith/calclib/validation").rglob("*.jsonl") for r in _jsonl(p)]
    assert {r["instance_id"] for r in reports if r["status"] == "kept"} == {t["instance_id"] for t in tasks}
    assert all(r["status"] in ("kept", "no_fail_to_pass", "no_pass_to_pass") for r in reports), reports


def test_statements_do_not_give_the_fix_away(embedded_local_run):
    work = embedded_local_run
    tasks = {t["instance_id"]: t for t in _jsonl(work / "results/smith/calclib/tasks.jsonl")}
    records = [r for p in sorted((work / "results/smith/statements").glob("*.jsonl")) for r in _jsonl(p)]
    assert {r["instance_id"] for r in records} == set(tasks)
    for r in records:
        t = tasks[r["instance_id"]]
        assert r["problem_statement"] and r["model"] == "scripted" and r["endpoint"] == "scripted"
        assert re.fullmatch(r"[0-9a-f]{64}", r["prompt_sha256"]) and r["temperature"] == 0.0
        assert leaks(r["problem_statement"], patch=t["patch"], tests=t["FAIL_TO_PASS"]) == []


def test_synthesized_dataset_is_converted_and_every_task_validates(embedded_local_run):
    work = embedded_local_run
    ds = read_json(work / "results/smith/smith-calclib.dataset.json")
    tasks = _jsonl(work / "results/smith/calclib/tasks.jsonl")
    assert ds["rows"] == len(tasks) and ds["dropped"] == []
    rows = read_json(work / "results/smith-calclib/train/rows.report.json")
    assert rows["rows"] == len(tasks)
    jsonl = _jsonl(work / "results/smith-calclib/train.jsonl")
    assert len(jsonl) == len(tasks)
    for line in jsonl:
        assert "patch" not in line["metadata"] or not line["metadata"].get("patch")
        assert line["metadata"]["docker_image"].startswith(
            "sweflow-smith/sweb.eval.x86_64.sweflow_s_calclib."
        )
    # gold resolves and empty does not, for every synthesized task, in fresh sandboxes of its own commit
    val = read_json(work / "results/smith-calclib/train/validation-summary.json")
    assert val["valid"] == val["tasks"] == len(tasks) and val["broken"] == [] and val["errors"] == [], val
    assert len(_jsonl(work / "results/smith-calclib/train/tasks.valid.jsonl")) == len(tasks)
    # one template per task, built from a repository that holds only that task's commit
    mapping = read_json(work / "results/smith-calclib/template-map.json")
    assert len(mapping) == len(tasks)


def test_smith_outputs_have_provenance_and_no_key(embedded_local_run):
    work = embedded_local_run
    for rel in ("results/smith/calclib/env.json", "results/smith/calclib/summary.json",
                "results/smith/calclib/candidates/procedural/0.jsonl",
                "results/smith/calclib/validation/combine/0.jsonl",
                "resources/datasets/smith-calclib/train.parquet"):  # fmt: skip
        rec = read_json(work / ".provenance" / f"{rel}.json")
        assert rec["rule"] in ("repo_env", "gather_tasks", "bug_candidates", "validate_candidates",
                               "smith_dataset"), rel  # fmt: skip
        assert rec["artifact"]["path"] == rel and len(rec["artifact"]["sha256"]) == 64
    # the LM section is recorded (redacted) with its key's variable name only, never a key
    rec = read_json(work / ".provenance/results/smith/calclib/candidates/lm_modify/0.jsonl.json")
    lm, ops = rec["params"]["smith"]["lm"], rec["operational"]["smith"]["lm"]
    assert lm["endpoint"] == "scripted" and "api_key" not in lm and "api_key" not in ops
    assert ops["api_key_env"] is None  # operational: recorded at run time, not a param


def test_dataset_source_smith_makes_the_synthesized_tasks_the_main_dataset(tmp_path):
    """`dataset.source: smith`: no Hub at all; the synthesized split is the dataset, through validation."""
    import shutil
    import subprocess
    import sys

    from tests.integration.conftest import ROOT, snakemake_env

    if not shutil.which("bwrap"):
        pytest.skip("needs bubblewrap")
    cfg = tmp_path / "smith-main.yaml"
    cfg.write_text(
        "dataset: {name: synth, source: smith}\ne2e: {instance: null}\ntrain: {enabled: false}\n"
        "smith:\n  strategies:\n    procedural: {max_candidates: 3}\n    lm_modify: {enabled: false}\n"
        "    lm_rewrite: {enabled: false}\n    pr_mirror: {enabled: false}\n    combine: {enabled: false}\n"
    )
    work = tmp_path / "work"
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(work),
           "--profile", str(ROOT / "profiles" / "local"), "--workflow-profile", "none",
           "--configfile", str(ROOT / "config" / "config.yaml"), str(cfg), "--",
           "results/synth/train/validation-summary.json"]  # fmt: skip
    work.mkdir()
    res = subprocess.run(cmd, capture_output=True, text=True, env=snakemake_env(work), timeout=1200)
    assert res.returncode == 0, res.stderr[-4000:]
    assert not (work / "resources/datasets/synth/revision.json").exists()  # nothing was resolved on a Hub
    summary = read_json(work / "results/smith/calclib/summary.json")
    val = read_json(work / "results/synth/train/validation-summary.json")
    assert val["tasks"] == summary["tasks"] >= 1 and val["valid"] == val["tasks"], val
