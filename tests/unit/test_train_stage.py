"""The train stage's own rules: no valid task is an error, a changed recipe starts the run over, an e2b run
needs the proxy's public URL, the model endpoint follows the dataset's."""

from __future__ import annotations

import pytest

from sweflow.errors import SweflowError
from sweflow.stages import train as stage


def test_no_valid_task_is_one_clear_error(tmp_path):
    empty = tmp_path / "tasks.valid.jsonl"
    empty.write_text("")
    with pytest.raises(SweflowError) as err:
        stage.read_tasks(empty)
    assert str(empty) in err.value.one_line() and "no valid task" in err.value.one_line()


def test_a_changed_recipe_starts_the_run_over_and_the_same_one_keeps_its_state(tmp_path):
    work = stage._prepare_work(tmp_path, '{"lr": 1}')
    (work / "checkpoints").mkdir()
    (work / "checkpoints" / "checkpoint-3").mkdir()
    assert stage._prepare_work(tmp_path, '{"lr": 1}') == work
    assert (work / "checkpoints" / "checkpoint-3").exists()  # resumable
    stage._prepare_work(tmp_path, '{"lr": 2}')
    assert not (work / "checkpoints").exists()
    assert (work / "recipe.json").read_text() == '{"lr": 2}'


def test_an_e2b_run_without_a_public_proxy_url_stops_before_anything_starts(tmp_path):
    from sweflow.config import check

    cfg = check({"train": {"enabled": True}}, {})
    outputs = {k: str(tmp_path / k) for k in ("summary", "metrics", "rollouts", "final")}
    with pytest.raises(SweflowError) as err:
        stage.train_grpo_step(
            tmp_path / "missing.jsonl",
            tmp_path / "model",
            tmp_path / "map.json",
            outputs,
            train=cfg["train"],
            sandbox=cfg["sandbox"],
            provider="e2b",
        )
    assert "train.proxy.public_url" in err.value.one_line()
    assert not any((tmp_path / k).exists() for k in outputs)


def test_the_model_endpoint_follows_the_dataset_unless_set():
    cfg = {"dataset": {"hub": {"endpoint": "local"}}, "train": {"model": {"endpoint": "dataset"}}}
    assert stage.model_endpoint(cfg) == "local"
    cfg["train"]["model"]["endpoint"] = None
    assert stage.model_endpoint(cfg) is None


def test_what_the_engine_cannot_do_is_a_one_line_config_error_naming_file_and_key(tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "mine.yaml"
    bad.write_text("train:\n  enabled: true\n  engine: trl\n  parallel:\n    context: 4\n")
    res = subprocess.run([sys.executable, "-m", "sweflow.config", str(bad)], capture_output=True, text=True)
    assert res.returncode != 0
    lines = [x for x in (res.stdout + res.stderr).splitlines() if x.strip()]
    assert len(lines) == 1, lines
    assert (
        f"{bad}:5" in lines[0] and "train.parallel.context" in lines[0] and "context parallelism" in lines[0]
    )
