"""Experiment tracking: TensorBoard event files with sweflow's metric names on both engines, W&B offline.

The TRL runs are the toy runs of test_trl_engine (seconds on CPU); verl's side is its composed config.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from sweflow.errors import ConfigError
from sweflow.train.tracking import MetricsWriter, Tracking, scalars

pytest.importorskip("tensorboard")

# what both engines write into metrics.jsonl (sweflow.train.verl_metrics.VERL_METRIC_KEYS, the TRL trainer)
SHARED = ("reward_mean", "policy_loss", "kl", "clip_fraction", "tis_clipped_share", "entropy", "grad_norm")


def _tags(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return acc


def test_the_defaults_are_tensorboard_only_and_wandb_offline():
    t = Tracking.from_config({})
    assert t.report_to() == ["tensorboard"] and not t.wandb and t.wandb_mode == "offline"
    assert t.verl_loggers() == ["console", "file", "tensorboard"]
    off = Tracking.from_config({"tracking": {"backends": []}})
    assert off.report_to() == [] and off.verl_loggers() == ["console", "file"]
    on = Tracking.from_config({"tracking": {"wandb": {"enabled": True, "project": "p"}}})
    assert on.report_to() == ["tensorboard", "wandb"]
    env = on.env("/runs/r", "verl")
    assert env["TENSORBOARD_DIR"] == "/runs/r/tensorboard/verl" and env["WANDB_MODE"] == "offline"
    assert env["WANDB_PROJECT"] == "p" and env["WANDB_DIR"] == "/runs/r"
    assert on.env("/runs/r", "trl")["TENSORBOARD_LOGGING_DIR"] == "/runs/r/tensorboard/trl"


def test_wandb_on_without_the_package_is_one_config_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a))
    with pytest.raises(ConfigError) as err:
        Tracking(wandb=True).checked()
    line = err.value.one_line()
    assert "wandb package is not installed" in line and "train.tracking.wandb.enabled" in line
    assert "\n" not in line


def test_a_metrics_row_becomes_sweflow_tags_at_its_step(tmp_path):
    row = {"step": 3, "kl": 0.1, "lr": None, "aborted_by_reason": {"sandbox_died": 2}, "engine": "x"}
    assert scalars(row) == {"sweflow/kl": 0.1, "sweflow/aborted_by_reason/sandbox_died": 2.0}
    with MetricsWriter(tmp_path, Tracking(), run_name="r", attach={"config": {"seed": 1}}) as w:
        w.write_all([{"step": 1, "kl": 0.5}, row])
    acc = _tags(tmp_path / "tensorboard" / "sweflow")
    assert [(e.step, e.value) for e in acc.Scalars("sweflow/kl")] == [(1, 0.5), (3, pytest.approx(0.1))]
    assert "sweflow/config/text_summary" in acc.Tags()["tensors"]  # the run's config as text


def test_a_trl_run_writes_sweflow_and_trl_tags_to_tensorboard(tmp_path):
    from tests.unit.test_trl_engine import ToyRollouts, _recipe, _rows

    torch = pytest.importorskip("torch")
    from transformers import AutoTokenizer

    from sweflow.offline.tiny_model import tiny_model_path
    from sweflow.train.trl_engine import train_trl

    model_dir = tiny_model_path()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    prompt_ids = tok.encode("Say something:")
    torch.manual_seed(0)
    run = tmp_path / "run"
    work = run / "work"
    train_trl(
        _recipe(total_steps=3, save_every=3),
        rows=_rows(2),
        model_dir=model_dir,
        out_dir=work,
        rollouts_factory=lambda engine: ToyRollouts(engine, prompt_ids, range(40, 140)),
        tracking=Tracking.from_config({}),
        tracking_dir=run,
        attach={"config": {"run": "toy"}, "dataset_shas": ["abc123"]},
    )
    metrics = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
    acc = _tags(run / "tensorboard" / "sweflow")
    tags = set(acc.Tags()["scalars"])
    for name in SHARED:
        assert f"sweflow/{name}" in tags, sorted(tags)
    kl = acc.Scalars("sweflow/kl")
    assert [e.step for e in kl] == [1, 2, 3]
    assert [e.value for e in kl] == pytest.approx([m["kl"] for m in metrics], rel=1e-5)
    texts = {"sweflow/config/text_summary", "sweflow/dataset_shas/text_summary"}
    assert texts <= set(acc.Tags()["tensors"])
    # TRL's own names beside them (report_to tensorboard)
    trl = _tags(run / "tensorboard" / "trl")
    assert any(t.startswith("train/") for t in trl.Tags()["scalars"])
    assert not (run / "wandb").exists()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed")
def test_wandb_offline_writes_a_local_run_and_sends_nothing(tmp_path, monkeypatch):
    from tests.unit.test_trl_engine import ToyRollouts, _recipe, _rows

    torch = pytest.importorskip("torch")
    from transformers import AutoTokenizer

    from sweflow.offline.tiny_model import tiny_model_path
    from sweflow.train.trl_engine import train_trl

    for k in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens: any send would fail
    model_dir = tiny_model_path()
    prompt_ids = AutoTokenizer.from_pretrained(str(model_dir)).encode("Say something:")
    torch.manual_seed(0)
    run = tmp_path / "run"
    train_trl(
        _recipe(total_steps=2, save_every=2),
        rows=_rows(2),
        model_dir=model_dir,
        out_dir=run / "work",
        rollouts_factory=lambda engine: ToyRollouts(engine, prompt_ids, range(40, 140)),
        tracking=Tracking.from_config({"tracking": {"backends": [], "wandb": {"enabled": True}}}),
        tracking_dir=run,
        attach={"config": {"run": "toy"}},
    )
    offline = list((run / "wandb").glob("offline-run-*"))
    assert offline, list((run / "wandb").iterdir()) if (run / "wandb").exists() else "no wandb folder"
    assert list(offline[0].glob("*.wandb"))
    assert not (run / "tensorboard").exists()


def test_verl_gets_the_same_loggers_and_its_tensorboard_folder_in_the_run(tmp_path):
    pytest.importorskip("verl")
    from sweflow.train.verl_engine import compose_verl_config, launch_script, verl_overrides
    from tests.unit.test_verl_config import overrides_for, production_recipe

    recipe = production_recipe()
    on = Tracking.from_config({"tracking": {"wandb": {"enabled": True, "project": "swe"}}})
    base = overrides_for(recipe)
    overrides = verl_overrides(
        recipe,
        train_files="/runs/x/train.parquet",
        val_files="/runs/x/val.parquet",
        model_path="/models/m/hf",
        out_dir="/runs/x/work",
        agent_loop_config="/runs/x/agent_loops.yaml",
        tracking=on,
    )
    c = compose_verl_config(overrides)
    assert list(c.trainer.logger) == ["console", "file", "tensorboard", "wandb"]
    assert c.trainer.project_name == "swe" and c.trainer.experiment_name == recipe.run
    # verl's own logger names: every backend sweflow asks for is one verl's Tracking knows
    from verl.utils.tracking import Tracking as VerlTracking

    assert {"tensorboard", "wandb"} <= set(VerlTracking.supported_backend)
    script = launch_script(recipe, overrides, python="/py", ray_port=6379, log_dir=str(tmp_path),
                           env=on.env("/runs/x", "verl"))  # fmt: skip
    assert "export TENSORBOARD_DIR=/runs/x/tensorboard/verl" in script
    assert "export WANDB_MODE=offline" in script and "export WANDB_DIR=/runs/x" in script
    # off by default: tensorboard only; none at all when asked
    assert "trainer.logger=[console,file,tensorboard]" in verl_overrides(
        recipe, train_files="t", val_files="v", model_path="m", out_dir="/o", agent_loop_config="a",
        tracking=Tracking(),
    )  # fmt: skip
    assert "trainer.logger=[console,file]" in base  # no tracking given: verl's console and file only


def test_verl_rows_get_the_same_tags_as_trl_rows(tmp_path):
    """verl's file-logger JSONL -> metrics.jsonl (verl_metrics) -> the same sweflow/<name> tags."""
    from sweflow.train.tracking import write_tracking
    from sweflow.train.verl_metrics import VERL_METRIC_KEYS, convert_verl_log

    data = {key: 0.25 for key in VERL_METRIC_KEYS.values() if key}
    lines = [json.dumps({"step": s, "data": {**data, "training/global_step": s}}) for s in (1, 2)]
    (tmp_path / "verl.jsonl").write_text("\n".join(lines) + "\n")
    convert_verl_log(tmp_path / "verl.jsonl", tmp_path / "metrics.jsonl")
    run = tmp_path / "run"
    assert (
        write_tracking(tmp_path / "metrics.jsonl", run, Tracking(), run_name="r", attach={"config": {}}) == 2
    )
    tags = set(_tags(run / "tensorboard" / "sweflow").Tags()["scalars"])
    assert {f"sweflow/{n}" for n in SHARED} <= tags


def test_sft_reports_to_tensorboard_under_its_run_folder(tmp_path):
    import dataclasses

    from sweflow.offline.tiny_model import tiny_model_path
    from sweflow.train.sft import train_sft
    from tests.unit.test_sft_train import TRAIN, _train_rows

    run = tmp_path / "run"
    settings = dataclasses.replace(TRAIN, max_steps=3, save_every=0)
    train_sft(_train_rows(), tiny_model_path(), run / "work", settings, metrics_path=run / "metrics.jsonl",
              tracking={}, tracking_dir=run)  # fmt: skip
    acc = _tags(run / "tensorboard" / "sft")
    assert "train/loss" in acc.Tags()["scalars"] and len(acc.Scalars("train/loss")) == 3
