"""The embedded default's SFT branch (read from the session's embedded run, tests/integration/conftest.py):
the scripted expert drives Claude Code on the sample's validated train tasks (2 attempts each) -> fresh
grading -> chat messages in both forms -> a short SFT of the tiny model on CPU."""

from __future__ import annotations

import gzip
import json

import pytest

from sweflow.grading.evidence import read_evidence
from sweflow.util import read_json
from tests.integration.conftest import PLANTED_API_KEY

pytestmark = [pytest.mark.integration, pytest.mark.claude]

SFT = "results/sample/sft"


def _jsonl(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_counts_add_up_and_only_clean_resolved_attempts_are_kept(embedded_local_run):
    work = embedded_local_run
    tasks = _jsonl(work / "results/sample/train/tasks.valid.jsonl")
    preds = read_evidence(work / f"{SFT}/predictions/train/0.jsonl.gz")
    evals = {r["id"]: r for r in _jsonl(work / f"{SFT}/evaluations/train/0.jsonl")}
    assert len(preds) == 2 * len(tasks) == len(evals)
    summary = read_json(work / f"{SFT}/messages/summary.json")
    assert summary["attempts"] == len(preds) and summary["kept"] + summary["dropped"] == len(preds)
    assert summary["kept"] >= 3 and summary["dropped"] >= 3
    kept = sorted(i for i, r in evals.items() if r["kept"])
    assert summary["trajectory_ids"] == kept
    for i in kept:
        assert (
            evals[i]["resolved"] and evals[i]["integrity_violations"] == [] and evals[i]["status"] == "graded"
        )
    # what the scripted expert did wrong is what the grading says (a cheat is never kept)
    reasons = summary["dropped_by_reason"]
    assert set(reasons) <= {
        "empty_generation",
        "integrity_violation:test_edit",
        "not_resolved:fail_to_pass_failure",
    }
    assert sum(reasons.values()) == summary["dropped"]
    tools_rows = _jsonl(work / f"{SFT}/messages/tools.jsonl")
    text_rows = _jsonl(work / f"{SFT}/messages/text.jsonl")
    assert [r["id"] for r in tools_rows] == [r["id"] for r in text_rows] == kept
    assert all(r["tools"] and r["messages"][0]["role"] == "system" for r in tools_rows)


def test_sft_trains_the_tiny_model_on_the_kept_trajectories(embedded_local_run):
    work = embedded_local_run
    summary = read_json(work / f"{SFT}/train/tiny/summary.json")
    messages = read_json(work / f"{SFT}/messages/summary.json")
    assert (
        summary["rows"] == messages["rows"] and summary["kept"] + len(summary["dropped"]) == summary["rows"]
    )
    assert summary["kept"] >= 1 and summary["loss_last"] < summary["loss_first"], summary
    metrics = _jsonl(work / f"{SFT}/train/tiny/metrics.jsonl")
    assert len(metrics) == summary["steps"] and all(m["loss"] > 0 and m["lr"] >= 0 for m in metrics)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = work / f"{SFT}/train/tiny/final"
    AutoModelForCausalLM.from_pretrained(str(final))
    AutoTokenizer.from_pretrained(str(final))
    assert (work / f".provenance/{SFT}/train/tiny/summary.json.json").exists()
    assert (work / f".provenance/{SFT}/messages/tools.jsonl.json").exists()


def test_the_planted_key_is_in_no_artifact_log_or_record(embedded_local_run):
    work = embedded_local_run
    found = []
    for f in work.rglob("*"):
        if not f.is_file() or f.stat().st_size > 50 << 20 or ".hf" in f.parts:
            continue
        data = f.read_bytes()
        if f.suffix == ".gz":
            try:
                data = gzip.decompress(data)
            except OSError:
                pass
        if PLANTED_API_KEY.encode() in data:
            found.append(str(f.relative_to(work)))
    assert found == []
    # and the expert did see it: collection succeeded, which the scripted endpoint allows only with the key
    assert read_json(work / f"{SFT}/messages/summary.json")["collection"] == {"completed": 2 * len(
        _jsonl(work / "results/sample/train/tasks.valid.jsonl"))}  # fmt: skip
