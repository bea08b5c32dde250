"""Issue 46: a predictions file made elsewhere graded on held-out tasks in real local sandboxes
(sweflow.stages.evaluate.grade_predictions_step), and its figures checked against the SWE-bench harness's own
report functions on the same logs (`get_eval_report` per instance, `make_run_report` over them)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from sweflow.evaluation import harness_formats as hf
from sweflow.grading.evidence import read_evidence
from sweflow.sample import load_task
from sweflow.stages.evaluate import grade_predictions_step

try:
    from tests.integration.conftest_validation import local_env
except ModuleNotFoundError:  # pragma: no cover
    from conftest_validation import local_env  # type: ignore[no-redef]

pytestmark = [pytest.mark.integration]
IDS = ("sweflow__calclib-4", "sweflow__calclib-8", "sweflow__calclib-1", "sweflow__calclib-5")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return local_env(tmp_path_factory.mktemp("eval"), ids=IDS)


def test_an_outside_predictions_file_is_graded_as_the_harness_grades_it(env, tmp_path, monkeypatch):
    insts = {i: load_task(i) for i in IDS}
    tasks = tmp_path / "tasks.valid.jsonl"
    tasks.write_text("".join(json.dumps({"metadata": env.meta(insts[i])}) + "\n" for i in IDS))
    wrong = env.make_patch(insts["sweflow__calclib-8"]["base_commit"], {"calclib/__init__.py": "X = 1\n"})
    preds = {  # the harness's own {instance_id: prediction} shape, as a leaderboard submission has it
        "sweflow__calclib-4": hf.prediction("sweflow__calclib-4", "other-agent", insts["sweflow__calclib-4"]["patch"]),
        "sweflow__calclib-8": hf.prediction("sweflow__calclib-8", "other-agent", wrong),
        "sweflow__calclib-1": hf.prediction("sweflow__calclib-1", "other-agent", ""),
        "not-a-task": hf.prediction("not-a-task", "other-agent", "diff --git a/x b/x\n"),
    }  # fmt: skip
    pfile = tmp_path / "preds.json"
    pfile.write_text(json.dumps(preds))
    out = {k: str(tmp_path / "out" / f"{k}.{ext}") for k, ext in
           (("report", "json"), ("graded", "jsonl"), ("evidence", "jsonl.gz"))}  # fmt: skip
    Path(out["report"]).parent.mkdir()
    sandbox = {"provider": "local", "local": {"templates_root": str(env.tmp / "local-templates")}}
    ours = grade_predictions_step(pfile, tasks, out, sandbox=sandbox, provider="local")
    assert ours["resolved_ids"] == ["sweflow__calclib-4"] and ours["unresolved_ids"] == ["sweflow__calclib-8"]
    assert ours["empty_patch_ids"] == ["sweflow__calclib-1"] and ours["incomplete_ids"] == [
        "sweflow__calclib-5"
    ]
    graded = [json.loads(x) for x in Path(out["graded"]).read_text().splitlines()]
    assert [g["outcome"] for g in graded] == ["resolved", "unresolved", "empty_patch", "not_a_task"]

    # the harness grades the same logs itself and makes its run report from its own per-instance reports
    grading = importlib.import_module("swebench.harness.grading")
    reporting = importlib.import_module("swebench.harness.reporting")
    monkeypatch.chdir(tmp_path)
    agree = 0
    for ev in read_evidence(out["evidence"]):
        iid = ev["instance_id"]
        d = Path("logs/run_evaluation/run1/other-agent") / iid
        d.mkdir(parents=True)
        (d / "test_output.txt").write_text(ev["log"])
        spec = env.harness.make_test_spec(insts[iid])
        theirs = grading.get_eval_report(
            spec, preds[iid], str(d / "test_output.txt"), include_tests_status=False
        )
        (d / "report.json").write_text(json.dumps(theirs))
        agree += theirs[iid]["resolved"] == (iid in ours["resolved_ids"])
    assert agree == 2  # both graded predictions: the harness's verdict on our log is ours
    run = json.loads(Path(reporting.make_run_report(
        {k: v for k, v in preds.items() if k in IDS}, [insts[i] for i in IDS], "run1")).read_text())  # fmt: skip
    for key in ("unstopped_instances", "unstopped_containers", "unremoved_images"):
        run.pop(key, None)
    assert run == ours
