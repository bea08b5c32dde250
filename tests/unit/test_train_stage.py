"""The train stage's own rules: no valid task is an error, a changed recipe starts the run over, an e2b run
needs the proxy's public URL, the model endpoint follows the dataset's."""

from __future__ import annotations

import json

import pytest

from sweflow.errors import SweflowError
from sweflow.stages import train as stage
from sweflow.train import engines
from sweflow.train.resume import prepare_work


def test_no_valid_task_is_one_clear_error(tmp_path):
    empty = tmp_path / "tasks.valid.jsonl"
    empty.write_text("")
    with pytest.raises(SweflowError) as err:
        stage.read_tasks(empty)
    assert str(empty) in err.value.one_line() and "no valid task" in err.value.one_line()


def test_a_changed_fingerprint_starts_the_run_over_saying_what_changed_and_the_same_one_keeps_its_state(
    tmp_path, caplog
):
    same = {"format": 2, "recipe": {"optim": {"lr": 1}}, "weights": "w1", "tasks": "t1"}
    work = prepare_work(tmp_path / "work", same)
    (work / "checkpoints").mkdir()
    (work / "checkpoints" / "checkpoint-3").mkdir()
    assert prepare_work(tmp_path / "work", dict(same)) == work
    assert (work / "checkpoints" / "checkpoint-3").exists()  # resumable
    with caplog.at_level("WARNING", logger="sweflow.train"):
        prepare_work(tmp_path / "work", {**same, "recipe": {"optim": {"lr": 2}}, "weights": "w2"})
    assert not (work / "checkpoints").exists()
    assert '"w2"' in (work / "recipe.json").read_text()
    assert "the recipe (train.optim.lr); the starting weights changed" in caplog.text


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


def test_the_verl_run_writes_its_inputs_launches_once_and_publishes_metrics_and_the_merged_model(
    tmp_path, monkeypatch
):
    """The production path up to the GPUs: parquet rows the agent loop reads, a secret-free rollout spec,
    overrides that compose, one launcher call, verl's metrics converted, verl's merger on the last step."""
    import json
    import sys

    import pandas as pd

    pytest.importorskip("verl")
    from sweflow.config import check
    from sweflow.offline.tiny_model import build_tiny_tokenizer
    from sweflow.train.verl_agent_loop import load_rollout_spec

    cfg = check(
        {
            "sandbox": {"provider": "docker"},
            "train": {
                "enabled": True,
                "engine": "verl",
                "prompts_per_step": 1,
                "samples_per_prompt": 2,
                "global_batch": 2,
                "total_steps": 1,
                "save_every": 1,
                "parallel": {"gpus_per_node": 2, "tensor": 2},
                "max_context_tokens": 16384,  # one GPU's 16,384 tokens without context parallelism
                "max_prompt_tokens": 8192,
            },
        },
        {},
    )
    model = tmp_path / "model"
    build_tiny_tokenizer(model)
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3", "tie_word_embeddings": True}))
    rows = [
        {
            "prompt": [{"role": "user", "content": "fix it"}],
            "metadata": {"instance_id": "t-1", "base_commit": "a" * 40},
        }
    ]
    tasks = tmp_path / "tasks.valid.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "map.json").write_text("{}")
    monkeypatch.setenv("E2B_API_KEY", "e2b_secret_value")
    calls = []

    def fake_run(cmd, check=False, **kw):
        calls.append(cmd)
        work = tmp_path / "results" / "grpo" / "work"
        if cmd[0] == "bash":  # "verl": one step of metrics, the agent loop's rollout log, a checkpoint
            (work / "logs" / "verl_metrics").mkdir(parents=True)
            data = {"training/global_step": 1, "critic/score/mean": 0.5, "actor/pg_loss": 0.1}
            (work / "logs" / "verl_metrics" / "a.jsonl").write_text(
                json.dumps({"step": 1, "data": data}) + "\n"
            )
            (work / "rollout-log").mkdir()
            recs = [
                {"step": 1, "instance_id": "t-1", "group": "0", "reward": r, "aborted": False}
                for r in (0.0, 1.0)
            ]
            (work / "rollout-log" / "h-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
            (work / "checkpoints").mkdir(parents=True, exist_ok=True)
            (work / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("1")
        else:  # verl's model merger
            target = cmd[cmd.index("--target_dir") + 1]
            (tmp_path / "merged").mkdir()
            (tmp_path / "merged" / "model.safetensors").write_bytes(b"weights")
            __import__("os").replace(tmp_path / "merged", target)
        return __import__("subprocess").CompletedProcess(cmd, 0)

    monkeypatch.setattr(engines.subprocess, "run", fake_run)
    out = tmp_path / "results" / "grpo"
    outputs = {k: str(out / n) for k, n in (("summary", "summary.json"), ("metrics", "metrics.jsonl"), ("rollouts", "rollouts"), ("final", "final"))}  # fmt: skip
    summary = stage.train_grpo_step(tasks, model, tmp_path / "map.json", outputs, train=cfg["train"], sandbox=cfg["sandbox"], provider="docker")  # fmt: skip

    assert [c[0] for c in calls] == ["bash", sys.executable]
    merge = calls[1]
    assert merge[1:5] == ["-m", "verl.model_merger", "merge", "--backend"] and "--tie-word-embedding" in merge
    assert merge[merge.index("--local_dir") + 1].endswith("checkpoints/global_step_1/actor")
    from verl.model_merger.base_model_merger import parse_args  # verl's own parser accepts the command

    monkeypatch.setattr(sys, "argv", ["merger", *merge[3:]])
    assert parse_args().backend == "megatron"
    work = out / "work"
    frame = pd.read_parquet(work / "train.parquet")
    assert (
        json.loads(frame.loc[0, "sweflow_row"]) == rows[0]
        and frame.loc[0, "agent_name"] == "sweflow_claude_code"
    )
    spec_text = (work / "rollout-spec.json").read_text()
    assert (
        "e2b_secret_value" not in spec_text
        and load_rollout_spec(work / "rollout-spec.json")["provider"] == "docker"
    )
    # the proxy caps each call at max_response_tokens; the trajectory is capped at the context window
    sampling = load_rollout_spec(work / "rollout-spec.json")["sampling"]
    assert (sampling["max_new_tokens"], sampling["max_context_tokens"]) == (
        cfg["train"]["max_response_tokens"],
        16384,
    )
    launch = (work / "launch.sh").read_text()
    assert (
        "verl.trainer.main_ppo" in launch
        and "SWEFLOW_ROLLOUT_SPEC" in launch
        and "e2b_secret_value" not in launch
    )
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["step"] == 1 and metrics[0]["reward_mean"] == 0.5 and metrics[0]["policy_loss"] == 0.1
    assert metrics[0]["reward_std"] == pytest.approx(2**-0.5)  # from the agent loop's rollout log
    assert (out / "rollouts" / "step-1.jsonl").exists() and (out / "final" / "model.safetensors").exists()
    assert summary["engine"] == "verl" and summary["final_from_step"] == 1


def test_grpo_leaves_out_tasks_without_fail_to_pass_twins_unless_allowed(tmp_path):
    from sweflow.errors import TrainError
    from sweflow.stages.train import guarded_rows

    rows = [{"metadata": {"instance_id": f"o__r-{i}"}} for i in (1, 2, 3)]
    summary = tmp_path / "validation-summary.json"
    summary.write_text(json.dumps({"without_f2p_twins": ["o__r-2"]}))
    kept, left = guarded_rows(rows, summary, named=False, allow=False)
    assert [r["metadata"]["instance_id"] for r in kept] == ["o__r-1", "o__r-3"] and left == ["o__r-2"]
    assert guarded_rows(rows, summary, named=False, allow=True) == (rows, [])
    assert guarded_rows(rows, None, named=False, allow=False) == (rows, [])
    # named in train.instances: an error naming the key, not a silent drop; nothing left: an error too
    for named, only in ((True, rows), (False, rows[1:2])):
        with pytest.raises(TrainError) as exc:
            guarded_rows(only, summary, named=named, allow=False)
        assert "o__r-2" in str(exc.value) and str(summary) in str(exc.value)
        assert exc.value.field == ("train.instances" if named else "train.allow_twinless")


def test_train_instances_keeps_those_rows_in_the_splits_order_and_refuses_an_unknown_id():
    from sweflow.errors import TrainError
    from sweflow.stages.train import select_instances

    rows = [{"metadata": {"instance_id": f"o__r-{i}"}} for i in (1, 2, 3)]
    assert select_instances(rows, None, "t.jsonl") is rows
    got = select_instances(rows, ["o__r-3", "o__r-1"], "t.jsonl")
    assert [r["metadata"]["instance_id"] for r in got] == ["o__r-1", "o__r-3"]
    for bad in (["o__r-9"], []):
        with pytest.raises(TrainError) as exc:
            select_instances(rows, bad, "t.jsonl")
        assert exc.value.field == "train.instances" and "t.jsonl" in str(exc.value)
