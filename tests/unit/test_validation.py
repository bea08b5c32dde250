"""validate_tasks stage functions: verdicts, per-task inputs from JSONL + parquet, summary (no daemons)."""

from __future__ import annotations

import json
import os

import pytest

from sweflow.errors import DatasetError
from sweflow.grading.evaluate import EvalResult
from sweflow.grading.task_validation import decide, validate_task
from sweflow.sandbox.settings import NetworkSettings
from sweflow.stages.validate import summarize, write_task_inputs, write_valid_rows
from sweflow.util import jsonl_line, read_json


def run(kind: str, i: int, resolved: bool, reason: str | None = None, error: str | None = None) -> dict:
    if not resolved and reason is None:
        reason = "fail_to_pass_failure"
    return {"patch": kind, "run": i, "resolved": resolved, "failure_reason": reason, "error": error}


def runs(kind: str, *resolved: bool, reason: str | None = None) -> list[dict]:
    return [run(kind, i, r, None if r else reason) for i, r in enumerate(resolved)]


@pytest.mark.parametrize(
    ("gold", "empty", "verdict", "reason"),
    [
        (runs("gold", True, True), runs("empty", False, False), "valid", None),
        (runs("gold", False, False), runs("empty", False, False), "gold_fails", "fail_to_pass_failure x2"),
        (
            runs("gold", False, False, reason="failed_apply_patch"),
            runs("empty", False, False),
            "gold_fails",
            "failed_apply_patch x2",
        ),
        (
            runs("gold", True, True),
            runs("empty", True, True),
            "empty_passes",
            "empty patch resolved 2/2 runs",
        ),
        (
            runs("gold", True, False),
            runs("empty", False, False),
            "flaky",
            "gold resolved 1/2 runs: fail_to_pass_failure",
        ),
        (runs("gold", True, True), runs("empty", False, True), "flaky", "empty patch resolved 1/2 runs"),
        # gold never works: that is the finding, whatever the empty runs did
        (runs("gold", False, False), runs("empty", True, False), "gold_fails", "fail_to_pass_failure x2"),
        (runs("gold", False, False), runs("empty", True, True), "gold_fails", "fail_to_pass_failure x2"),
    ],
)
def test_decide(gold, empty, verdict, reason):
    assert decide(gold, empty) == (verdict, reason)


def test_decide_infrastructure_errors_and_pre_reasons():
    gold = [run("gold", 0, True), run("gold", 1, False, "fresh_eval_exception", "SandboxError: boom")]
    verdict, reason = decide(gold, runs("empty", False, False))
    assert verdict == "error" and reason == "fresh_eval_exception (gold run 1): SandboxError: boom"
    gold = [run("gold", 0, False, "fresh_eval_timeout", "deadline")]
    assert decide(gold, [])[0] == "error"
    assert decide([], [], "prohibited_test_modification") == ("gold_fails", "prohibited_test_modification")


GOOD = "diff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1 +1 @@\n-a\n+b\n"
META = {"instance_id": "o__r-1", "sandbox_image": "tpl-1", "base_commit": "b" * 40}


class ScriptedEval:
    """Stands in for evaluate_patch: resolved iff the patch is non-empty (or per a schedule)."""

    def __init__(self, schedule=None):
        self.calls: list[tuple[str, str, float]] = []
        self.schedule = schedule

    def __call__(self, provider, template, metadata, patch, *, sandbox_timeout, **kw):
        self.calls.append((template, patch, sandbox_timeout))
        self.kw = kw
        kind = "gold" if patch else "empty"
        resolved = bool(patch) if self.schedule is None else self.schedule[kind].pop(0)
        timings = {"create_s": 0.1, "setup_s": 0.1, "eval_s": 1.0, "kill_s": 0.1, "total_s": 1.3}
        marker = {"resolved": resolved, "fail_to_pass_success": int(resolved), "fail_to_pass_total": 1,
                  "log_tail": "long log"}  # fmt: skip
        return EvalResult(
            float(resolved),
            resolved,
            None if resolved else "fail_to_pass_failure",
            marker,
            "tail",
            timings,
            None,
        )


class P:
    name = "fake"


def test_validate_task_runs_gold_and_empty_k_times_and_records_them():
    ev = ScriptedEval()
    rec = validate_task(P(), META, GOOD, repeats=3, parallel=2, sandbox_timeout=77, evaluate=ev)
    assert sorted(c[1] for c in ev.calls) == ["", "", "", GOOD, GOOD, GOOD]
    assert {c[0] for c in ev.calls} == {"tpl-1"} and {c[2] for c in ev.calls} == {77}
    assert (rec["verdict"], rec["reason"], rec["provider"], rec["repeats"]) == ("valid", None, "fake", 3)
    assert rec["gold"] == {"resolved": 3, "runs": 3} and rec["empty"] == {"resolved": 0, "runs": 3}
    assert [(r["patch"], r["run"]) for r in rec["runs"]] == [
        ("gold", 0), ("empty", 0), ("gold", 1), ("empty", 1), ("gold", 2), ("empty", 2)
    ]  # fmt: skip
    assert rec["runs"][0]["marker"] == {"fail_to_pass_success": 1, "fail_to_pass_total": 1}
    assert rec["timings"]["eval_s"] == 6.0 and rec["timings"]["overhead_s"] == pytest.approx(1.8)


def test_validate_task_flaky_and_test_editing_gold():
    ev = ScriptedEval({"gold": [True, False], "empty": [False, False]})
    assert validate_task(P(), META, GOOD, repeats=2, evaluate=ev)["verdict"] == "flaky"
    ev = ScriptedEval()
    bad = GOOD.replace("pkg/mod.py", "tests/test_mod.py")
    rec = validate_task(P(), META, bad, evaluate=ev)
    assert (rec["verdict"], rec["reason"], rec["gold_test_files"]) == (
        "gold_fails",
        "prohibited_test_modification",
        ["tests/test_mod.py"],
    )
    assert ev.calls == [], "nothing runs for an ungradable gold patch"
    assert validate_task(P(), META, "", evaluate=ev)["reason"] == "empty_generation"


@pytest.fixture
def split_files(tmp_path):
    from sweflow.sample import sample_rows, skyrl_rows, write_parquet

    parquet = write_parquet(skyrl_rows("train"), tmp_path / "train.parquet")
    rows = sample_rows("train")
    lines = [{"prompt": [], "label": "", "metadata": {"instance_id": r["instance_id"], "base_commit": r["base_commit"]}}
             for r in rows]  # fmt: skip
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(jsonl_line(x) for x in lines))
    return parquet, jsonl, rows


def test_task_inputs_take_gold_from_parquet_and_rewrite_only_changes(tmp_path, split_files):
    parquet, jsonl, rows = split_files
    out, listing = tmp_path / "tasks", tmp_path / "tasks.txt"
    (out).mkdir()
    (out / "stale__task-1.json").write_text("{}")
    ids = write_task_inputs(jsonl, parquet, out, listing, split="train")
    assert ids == [r["instance_id"] for r in rows]
    assert listing.read_text().splitlines() == ids
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{i}.json" for i in ids)
    first = read_json(out / f"{ids[0]}.json")
    assert first["gold_patch"] == rows[0]["patch"] and first["metadata"]["instance_id"] == ids[0]
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    # change one JSONL row: only that task's file is rewritten
    lines = jsonl.read_text().splitlines(keepends=True)
    row = json.loads(lines[1])
    row["metadata"]["extra"] = 1
    lines[1] = jsonl_line(row)
    jsonl.write_text("".join(lines))
    os.utime(out / f"{ids[0]}.json", ns=(1, 1))
    stamps[f"{ids[0]}.json"] = 1
    write_task_inputs(jsonl, parquet, out, listing, split="train")
    changed = sorted(p.name for p in out.iterdir() if p.stat().st_mtime_ns != stamps[p.name])
    assert changed == [f"{ids[1]}.json"]


def test_task_inputs_reject_rows_missing_from_parquet(tmp_path, split_files):
    parquet, jsonl, _ = split_files
    with jsonl.open("a") as fh:
        fh.write(jsonl_line({"metadata": {"instance_id": "ghost__task-9"}}))
    with pytest.raises(DatasetError, match="ghost__task-9"):
        write_task_inputs(jsonl, parquet, tmp_path / "t", tmp_path / "t.txt", split="train")


def test_summary_keeps_valid_lines_and_reports_every_broken_task(tmp_path, split_files):
    _, jsonl, rows = split_files
    ids = [r["instance_id"] for r in rows]
    verdicts = ["valid", "gold_fails", "valid", "flaky", "empty_passes"]  # the 6th has no result
    results = []
    for n, (iid, v) in enumerate(zip(ids, verdicts, strict=False)):
        p = tmp_path / f"{iid}.json"
        gold = [{"patch": "gold", "run": 0, "canaries": 5, "f2p_twins": 2 * (n == 0)}]
        p.write_text(json.dumps({"instance_id": iid, "verdict": v, "reason": None if v == "valid" else f"why-{v}",
                                 "runs": gold}))  # fmt: skip
        results.append(p)
    s = summarize(
        jsonl, results, tmp_path / "summary.json", tmp_path / "valid.jsonl", dataset="d", split="train"
    )
    lines = jsonl.read_text().splitlines(keepends=True)
    assert (tmp_path / "valid.jsonl").read_text() == lines[0] + lines[2]
    assert s["tasks"] == 6 and s["valid"] == 2
    assert s["verdicts"] == {"valid": 2, "gold_fails": 1, "empty_passes": 1, "flaky": 1, "unguarded": 0,
                             "error": 1}  # fmt: skip
    assert s["unguarded"] == [] and s["unguarded_kept"] is False
    assert s["without_f2p_twins"] == [ids[2]]  # valid, but its gold runs carried no FAIL_TO_PASS twin
    assert s["broken"] == [
        {"instance_id": ids[1], "verdict": "gold_fails", "reason": "why-gold_fails"},
        {"instance_id": ids[3], "verdict": "flaky", "reason": "why-flaky"},
        {"instance_id": ids[4], "verdict": "empty_passes", "reason": "why-empty_passes"},
    ]
    assert s["errors"] == [{"instance_id": ids[5], "verdict": "error", "reason": "no validation result"}]
    assert read_json(tmp_path / "summary.json") == s


# ----- unguarded: gold passed, but its runs carried no canary -------------------------------------------------
class CanaryEval(ScriptedEval):
    """ScriptedEval whose runs drew canaries for a pytest runner, planting `planted` of them."""

    def __init__(self, planted: int, family: str | None = "pytest"):
        super().__init__()
        self.planted, self.family = planted, family

    def __call__(self, *args, **kw):
        res = super().__call__(*args, **kw)
        res.canaries = [
            {"name": f"test_c{i}", "expect": "fail", "got": "FAILED"} for i in range(self.planted)
        ]
        res.canary_family = self.family
        return res


def test_a_row_whose_runs_plant_no_canary_is_unguarded_not_valid():
    rec = validate_task(P(), META, GOOD, repeats=2, evaluate=CanaryEval(planted=0))
    assert rec["verdict"] == "unguarded"
    assert rec["reason"].startswith("no canary could be planted in 2 of 2 gold runs (pytest runner)")
    assert [r["canary_family"] for r in rec["runs"]] == ["pytest"] * 4
    # canaries planted: valid; no canary drawn at all (canaries off, or a runner that carries none): valid
    assert validate_task(P(), META, GOOD, repeats=2, evaluate=CanaryEval(planted=2))["verdict"] == "valid"
    assert validate_task(P(), META, GOOD, evaluate=CanaryEval(planted=0, family=None))["verdict"] == "valid"
    # one bare gold run is enough: the rollouts of that row would be unguarded as often
    gold = [
        {**r, "canary_family": "pytest", "canaries": n}
        for r, n in zip(runs("gold", True, True), (3, 0), strict=True)
    ]
    assert decide(gold, runs("empty", False, False))[0] == "unguarded"
    # a verdict about the task outranks it: a failing gold stays gold_fails
    gold = [{**r, "canary_family": "pytest", "canaries": 0} for r in runs("gold", False, False)]
    assert decide(gold, runs("empty", False, False))[0] == "gold_fails"


@pytest.mark.parametrize("allow", [False, True])
def test_unguarded_tasks_are_left_out_of_training_unless_allowed_and_counted(tmp_path, split_files, allow):
    _, jsonl, rows = split_files
    ids = [r["instance_id"] for r in rows]
    results = []
    for iid, v in zip(ids, ["valid", "unguarded", "valid", "unguarded", "flaky", "valid"], strict=True):
        p = tmp_path / f"{iid}.json"
        p.write_text(
            json.dumps({"instance_id": iid, "verdict": v, "reason": None if v == "valid" else f"why-{v}"})
        )
        results.append(p)
    s = summarize(jsonl, results, tmp_path / "summary.json", tmp_path / "valid.jsonl", allow_unguarded=allow)
    lines = jsonl.read_text().splitlines(keepends=True)
    kept = [0, 1, 2, 3, 5] if allow else [0, 2, 5]
    assert (tmp_path / "valid.jsonl").read_text() == "".join(lines[i] for i in kept)
    assert s["valid"] == len(kept) and s["verdicts"]["unguarded"] == 2 and s["verdicts"]["valid"] == 3
    assert s["unguarded"] == [{"instance_id": ids[i], "verdict": "unguarded", "reason": "why-unguarded"}
                              for i in (1, 3)]  # fmt: skip
    assert s["unguarded_kept"] is allow
    assert [b["verdict"] for b in s["broken"]] == ["flaky"], "unguarded is not broken: its gold passed"


# ----- infrastructure failures: retried, then an error verdict that is not final -----------------------------
class FlakyInfraEval:
    """Stands in for evaluate_patch: the first `fail` calls die of an infrastructure failure."""

    def __init__(self, fail: int):
        self.fail, self.calls = fail, 0
        self.kw: list[dict] = []

    def __call__(self, provider, template, metadata, patch, *, sandbox_timeout, **kw):
        self.calls += 1
        self.kw.append(kw)
        if self.calls <= self.fail:
            return EvalResult(
                0.0, False, "sandbox_lost", None, "", {}, "the sandbox died", log="+ cd /testbed\n"
            )
        resolved = bool(patch)
        return EvalResult(
            float(resolved), resolved, None if resolved else "fail_to_pass_failure", {}, "", {}, None,
            statuses={"t::a": "PASSED" if resolved else "FAILED"}, exit_code=0 if resolved else 1, log="LOG",
        )  # fmt: skip


def test_an_infrastructure_failure_is_retried_and_then_the_task_is_valid(caplog):
    ev, evidence = FlakyInfraEval(fail=2), []
    rec = validate_task(
        P(), META, GOOD, repeats=1, error_attempts=3, error_backoff=0, evaluate=ev, evidence=evidence
    )
    assert rec["verdict"] == "valid" and ev.calls == 4
    gold = next(r for r in rec["runs"] if r["patch"] == "gold")
    assert gold["attempts"] == 3 and gold["infra_errors"] == ["sandbox_lost: the sandbox died"] * 2
    assert all(k == {"trusted_patch": True} for k in ev.kw), "gold and empty are trusted; no network asked"
    assert [(e["patch"], e["attempt"], e["failure_reason"]) for e in evidence] == [
        ("gold", 1, "sandbox_lost"), ("gold", 2, "sandbox_lost"), ("gold", 3, None), ("empty", 1, "fail_to_pass_failure")
    ]  # fmt: skip


def test_infrastructure_failing_every_try_is_an_error_verdict_not_gold_fails():
    ev = FlakyInfraEval(fail=100)
    rec = validate_task(P(), META, GOOD, repeats=2, error_attempts=2, error_backoff=0, evaluate=ev)
    assert rec["verdict"] == "error" and ev.calls == 8
    assert rec["reason"] == "sandbox_lost (gold run 0, 2 tries): the sandbox died"


def test_an_error_task_is_reported_apart_and_its_input_made_newer_so_a_rerun_retries_it(
    tmp_path, split_files, caplog
):
    from sweflow.stages.validate import validate_task_file

    _, jsonl, rows = split_files
    ids = [r["instance_id"] for r in rows][:2]
    jsonl.write_text("".join(jsonl.read_text().splitlines(keepends=True)[:2]))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    results = []
    for iid, fail in zip(ids, (0, 100), strict=True):
        task = tasks / f"{iid}.json"
        task.write_text(
            json.dumps(
                {
                    "instance_id": iid,
                    "metadata": {**META, "instance_id": iid, "repo": "o/r"},
                    "gold_patch": GOOD,
                }
            )
        )
        os.utime(task, (1000, 1000))
        out = tmp_path / "validation" / f"{iid}.json"
        rec = validate_task_file(
            task, out, provider=P(), repeats=1, evidence_out=tmp_path / "validation" / f"{iid}.evidence.jsonl.gz",
            error_attempts=2, error_backoff=0, evaluate=FlakyInfraEval(fail),
            network=NetworkSettings.from_config({"eval": "none", "eval_repos": {"O/R": "internet"}}),
        )  # fmt: skip
        assert rec["verdict"] == ("valid" if fail == 0 else "error")
        results.append(out)
    assert "could not be validated, an infrastructure failure" in caplog.text
    caplog.clear()
    s = summarize(jsonl, results, tmp_path / "s.json", tmp_path / "valid.jsonl", reopen_errors=True)
    assert s["verdicts"]["error"] == 1 and s["broken"] == []
    assert [e["instance_id"] for e in s["errors"]] == [ids[1]] and "sandbox_lost" in s["errors"][0]["reason"]
    assert (tmp_path / "valid.jsonl").read_text().count("\n") == 1, "only the valid task"
    assert "could NOT be validated" in caplog.text and ids[1] in caplog.text
    assert results[0].exists(), "a final verdict stays final"
    assert not results[1].exists(), "the error result is removed: the next run validates the task again"
    from sweflow.stages.validate import reopen_summaries

    assert reopen_summaries([tmp_path / "s.json", tmp_path / "missing.json"]) == [str(tmp_path / "s.json")]
    assert (tmp_path / "s.json").stat().st_mtime == 1, "dated back: the next run re-runs the summary"


def test_the_evidence_file_holds_every_evaluation_and_the_network_reaches_evaluate(tmp_path):
    from sweflow.grading.evidence import read_evidence
    from sweflow.stages.validate import validate_task_file

    task = tmp_path / "t.json"
    task.write_text(
        json.dumps(
            {"instance_id": "o__r-1", "metadata": {**META, "repo": "pydicom/pydicom"}, "gold_patch": GOOD}
        )
    )
    ev = FlakyInfraEval(fail=1)
    ev_out = tmp_path / "t.evidence.jsonl.gz"
    validate_task_file(task, tmp_path / "r.json", provider=P(), repeats=1, evidence_out=ev_out, error_backoff=0,
                       evaluate=ev, network=NetworkSettings.from_config({"eval_repos": {"pydicom/pydicom": "internet"}}))  # fmt: skip
    assert {k["network"] for k in ev.kw} == {"internet"}
    recs = read_evidence(ev_out)
    assert [(r["patch"], r["attempt"], r["log"]) for r in recs] == [
        ("gold", 1, "+ cd /testbed\n"), ("gold", 2, "LOG"), ("empty", 1, "LOG")
    ]  # fmt: skip
    assert recs[2]["statuses"] == {"t::a": "FAILED"} and recs[2]["exit_code"] == 1


def test_a_failed_verdict_carries_the_detail_that_counts_every_failing_test():
    detail = "pass_to_pass_regression: 71 of 159 (t1=FAILED, t2=ERROR, t3=FAILED, +68 more)"
    gold = [
        {**run("gold", 0, False, "pass_to_pass_regression"), "marker": {"failure_detail": detail}},
        {**run("gold", 1, False, "pass_to_pass_regression"), "marker": {"failure_detail": detail}},
    ]
    assert decide(gold, runs("empty", False, False)) == (
        "gold_fails",
        f"pass_to_pass_regression x2 — {detail}",
    )


def test_valid_rows_are_one_byte_stable_file_per_task(tmp_path):
    """The per-task inputs downstream of validation: a changed verdict touches only its task's file."""
    rows = {
        i: jsonl_line({"metadata": {"instance_id": i}, "prompt": f"p{i}"})
        for i in ("a__b-1", "a__b-2", "a__b-3")
    }
    valid, out, listing = tmp_path / "tasks.valid.jsonl", tmp_path / "rows", tmp_path / "rows.txt"
    valid.write_text("".join(rows.values()))
    assert write_valid_rows(valid, out, listing) == list(rows)
    assert {p.name: p.read_text() for p in out.iterdir()} == {f"{i}.jsonl": r for i, r in rows.items()}
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    # a-2 is no longer valid: its file goes, the others keep their bytes and mtimes
    valid.write_text(rows["a__b-1"] + rows["a__b-3"])
    assert write_valid_rows(valid, out, listing) == ["a__b-1", "a__b-3"]
    assert sorted(p.name for p in out.iterdir()) == ["a__b-1.jsonl", "a__b-3.jsonl"]
    assert all(p.stat().st_mtime_ns == before[p.name] for p in out.iterdir())
    assert listing.read_text() == "a__b-1\na__b-3\n"


class TwinEval(ScriptedEval):
    """Gold runs carry two FAIL_TO_PASS twins; a decoy run answers `decoy` (a failure reason or None)."""

    def __init__(self, decoy):
        super().__init__()
        self.decoy, self.decoy_calls = decoy, 0

    def __call__(self, provider, template, metadata, patch, *, sandbox_timeout, **kw):
        res = super().__call__(provider, template, metadata, patch, sandbox_timeout=sandbox_timeout, **kw)
        if patch:
            res.canaries = [{"of": "f2p", "expect": "fail"}] * 2
        if kw.get("decoy"):
            self.decoy_calls += 1
            res.resolved, res.reward, res.failure_reason = False, 0.0, self.decoy
            res.error = "sandbox gone" if self.decoy == "sandbox_lost" else None
        return res


@pytest.mark.parametrize(
    ("decoy", "verdict"),
    [
        (None, "valid"),
        ("fail_to_pass_failure", "valid"),
        ("runner_tampered", "gold_fails"),
        ("sandbox_lost", "error"),
    ],
)
def test_a_valid_task_with_twins_gets_a_decoy_run_of_its_gold_patch(decoy, verdict):
    """The decoy run decides only tampering (its F2P tests carry moved literals: the gold fails them) and
    an infrastructure failure there is an error, never a verdict about the task."""
    ev = TwinEval(decoy)
    rec = validate_task(P(), META, GOOD, repeats=2, evaluate=ev, decoys=1, error_attempts=2, error_backoff=0)
    tries = 2 if decoy == "sandbox_lost" else 1  # an infrastructure failure is tried again, as any run
    assert ev.decoy_calls == tries and rec["decoys"] == 1 and rec["verdict"] == verdict, rec
    assert [(r["patch"], r["run"]) for r in rec["runs"]][-1] == ("decoy", 0)
    if verdict == "gold_fails":
        assert rec["reason"].startswith("runner_tampered in decoy run 0")
    no_decoy = validate_task(P(), META, GOOD, repeats=1, evaluate=TwinEval(decoy), decoys=0)
    assert no_decoy["verdict"] == "valid" and no_decoy["decoys"] == 0


def test_no_decoy_run_without_twins_or_for_a_task_that_is_not_valid():
    ev = ScriptedEval()
    rec = validate_task(P(), META, GOOD, repeats=1, evaluate=ev, decoys=2)
    assert rec["decoys"] == 0 and len(ev.calls) == 2  # no F2P twin in the gold runs
    ev = TwinEval("runner_tampered")
    ev.schedule = {"gold": [False], "empty": [False]}
    rec = validate_task(P(), META, GOOD, repeats=1, evaluate=ev, decoys=2)
    assert rec["verdict"] == "gold_fails" and ev.decoy_calls == 0
