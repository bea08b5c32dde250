"""Resolve-rate figures (sweflow.evaluation.metrics) and SWE-bench's formats (sweflow.evaluation.harness_formats):
pass@k against its definition by enumeration, the interval, and the run report against the harness's own
`make_run_report` on the per-instance reports it reads."""

from __future__ import annotations

import importlib
import itertools
import json
from pathlib import Path

import pytest

from sweflow.errors import DatasetError
from sweflow.evaluation import harness_formats as hf
from sweflow.evaluation.metrics import bootstrap_interval, pass_at_k, resolve_figures


@pytest.mark.parametrize(("n", "c"), [(n, c) for n in range(1, 7) for c in range(n + 1)])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_resolved_attempt(n, c):
    attempts = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(attempts, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    with pytest.raises(ValueError):
        pass_at_k(n, c, n + 1)


def test_summary_pass_at_1_interval_reasons_and_cost():
    attempts = [
        {"instance_id": "a", "attempt": 0, "resolved": True, "turns": 4, "tokens": 100},
        {"instance_id": "a", "attempt": 1, "resolved": False, "failure_reason": "fail_to_pass_failure", "turns": 2, "tokens": 50},
        {"instance_id": "b", "attempt": 0, "resolved": False, "failure_reason": "runner_tampered", "turns": 6, "tokens": 300},
        {"instance_id": "b", "attempt": 1, "resolved": False, "failure_reason": "fail_to_pass_failure", "turns": 0, "tokens": 0},
    ]  # fmt: skip
    s = resolve_figures(attempts, 2, seed=0)
    assert s["pass@1"] == 0.25 and s["pass@2"] == 0.5 and s["tasks"] == 2 and s["attempts"] == 4
    assert s["resolved_ids"] == ["a"]
    assert s["failure_reasons"] == {"fail_to_pass_failure": 2, "runner_tampered": 1}
    assert s["turns_mean"] == 3.0 and s["tokens_mean"] == 112.5
    lo, hi = s["pass@1_interval"]
    assert 0.0 <= lo <= s["pass@1"] <= hi <= 0.5
    assert resolve_figures(attempts, 2, seed=0) == s  # seeded: the same attempts give the same interval


def test_bootstrap_interval_narrows_with_more_tasks():
    few = bootstrap_interval([1.0, 0.0] * 5, seed=0)
    many = bootstrap_interval([1.0, 0.0] * 200, seed=0)
    assert few[0] < many[0] <= 0.5 <= many[1] < few[1]
    assert bootstrap_interval([], seed=0) == (0.0, 0.0) and bootstrap_interval([1.0] * 3, seed=0) == (
        1.0,
        1.0,
    )


@pytest.mark.parametrize("shape", ["jsonl", "list", "object"])
def test_predictions_files_in_each_of_the_harness_shapes(tmp_path, shape):
    preds = [hf.prediction("a", "m", "diff --git a/x b/x\n"), hf.prediction("b", "m", "")]
    path = tmp_path / "preds.json"
    if shape == "jsonl":
        path.write_text("".join(json.dumps(p) + "\n" for p in preds))
    elif shape == "list":
        path.write_text(json.dumps(preds))
    else:
        path.write_text(json.dumps({p["instance_id"]: p for p in preds}))
    assert hf.read_predictions(path) == preds


def test_a_bad_prediction_names_file_row_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"instance_id": "a", "model_patch": ""}\n{"instance_id": "b"}\n')
    with pytest.raises(DatasetError) as e:
        hf.read_predictions(path)
    assert "bad.jsonl" in str(e.value) and "row 2" in str(e.value) and "model_patch" in str(e.value)
    path.write_text('{"instance_id": "a", "model_patch": ""}\n{"instance_id": "a", "model_patch": "x"}\n')
    with pytest.raises(DatasetError, match="predicted twice"):
        hf.read_predictions(path)


def test_the_run_report_is_the_harnesss_make_run_report(tmp_path, monkeypatch):
    """The harness's make_run_report reads one report.json per graded instance; given the per-instance
    reports `instance_report` writes, it must give the same run report as `run_report` does."""
    reporting = importlib.import_module("swebench.harness.reporting")
    dataset = [{"instance_id": i} for i in ("r", "u", "apply", "empty", "none", "err", "missing")]
    graded = {
        "r": {"resolved": True},
        "u": {"resolved": False, "failure_reason": "fail_to_pass_failure"},
        "apply": {"resolved": False, "failure_reason": "failed_apply_patch"},
        "err": {"infra": True, "failure_reason": "sandbox_lost"},
    }
    patches = {"r": "p", "u": "p", "apply": "p", "empty": "", "none": None, "err": "p", "extra": "p"}
    preds = [{"instance_id": i, "model_name_or_path": "m", "model_patch": p} for i, p in patches.items()]
    outcomes = {i: hf.outcome(patches[i], graded.get(i)) for i in patches}
    monkeypatch.chdir(tmp_path)
    for i, g in graded.items():
        if not g.get("infra"):  # an evaluation that never ran leaves no report: the harness counts an error
            d = Path("logs/run_evaluation/run1/m") / i
            d.mkdir(parents=True)
            (d / "report.json").write_text(json.dumps(hf.instance_report(i, patches[i], g)))
    theirs = json.loads(
        Path(reporting.make_run_report({p["instance_id"]: p for p in preds}, dataset, "run1")).read_text()
    )
    for key in ("unstopped_instances", "unstopped_containers", "unremoved_images"):
        theirs.pop(key, None)
    ours = hf.run_report([d["instance_id"] for d in dataset], preds, outcomes)
    assert ours == theirs
    assert ours["resolved_ids"] == ["r"] and ours["unresolved_ids"] == ["apply", "u"]
    assert ours["empty_patch_ids"] == ["empty", "none"] and ours["error_ids"] == ["err"]
    assert ours["incomplete_ids"] == ["missing"] and ours["submitted_instances"] == 7


@pytest.mark.parametrize(("engine", "port", "url", "field"), [
    ("trl", 8800, None, "train.proxy.public_url"),
    ("trl", 0, "https://proxy.example.org", "train.proxy.port"),
    ("verl", 8800, "https://gateway.example.org", "evaluate.proxy_url"),
])  # fmt: skip
def test_an_evaluation_with_cloud_sandboxes_needs_its_own_published_proxy(tmp_path, engine, port, url, field):
    """E2B sandboxes reach the evaluation's proxy over the internet: a port nobody published, no URL, or the
    verl recipe's URL (the Ray gateway, which no evaluation job runs) stop it before any model loads."""
    from sweflow.errors import ConfigError
    from sweflow.schema import defaults
    from sweflow.stages.evaluate import evaluate_checkpoint_step

    tasks = tmp_path / "tasks.valid.jsonl"
    tasks.write_text(json.dumps({"metadata": {"instance_id": "a"}}) + "\n")
    train = {
        **defaults("train"),
        "engine": engine,
        "proxy": {**defaults("train")["proxy"], "port": port, "public_url": url},
    }
    with pytest.raises(ConfigError) as e:
        evaluate_checkpoint_step(tmp_path / "no-model", tasks, {}, checkpoint="base", evaluate=defaults("evaluate"),
                                 train=train, sandbox={"provider": "e2b"}, provider="e2b")  # fmt: skip
    assert e.value.field == field
    if engine == "verl":  # the evaluation node's own published proxy passes the check (then no model loads)
        own = {**defaults("evaluate"), "proxy_url": "https://eval-node.example.org"}
        with pytest.raises(Exception) as e:
            evaluate_checkpoint_step(tmp_path / "no-model", tasks, {}, checkpoint="base", evaluate=own,
                                     train=train, sandbox={"provider": "e2b"}, provider="e2b")  # fmt: skip
        assert not str(getattr(e.value, "field", "") or "").endswith(("proxy_url", "public_url", ".port")), (
            e.value
        )
