"""A GRPO run resumes only from a complete checkpoint made from the same inputs (issue 45, points 1-3).

The train_grpo rule's body (`train_grpo_step`) with the real TRL engine on the tiny model; only the rollouts
are the toy environment of tests/unit/test_trl_engine.py (no sandbox), so a run of two steps takes seconds.
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from sweflow.stages import train as stage

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from tests.unit.test_trl_engine import ToyRollouts, _rows  # noqa: E402

TRAIN = {
    "enabled": True,
    "engine": "trl",
    "run": "toy",
    "prompts_per_step": 2,
    "samples_per_prompt": 4,
    "global_batch": 8,
    "micro_batch": 4,
    "total_steps": 2,
    "save_every": 1,
    "optim": {"lr": 2e-2, "weight_decay": 0.0},
    "max_response_tokens": 64,
    "rollout": {"max_concurrency": 1},
}


@pytest.fixture
def toy_engine(monkeypatch):
    """The TRL engine's process with the toy rollouts: the list of each run's rollouts comes back."""
    import sweflow.train.worker as worker
    from sweflow.train.trl_engine import train_trl

    made: list[ToyRollouts] = []

    def trl_in_process(recipe, rows, model_dir, work, proxy, sandbox, provider, **tracking):
        from transformers import AutoTokenizer

        prompt_ids = AutoTokenizer.from_pretrained(str(model_dir)).encode("Say something:")

        def factory(engine):
            made.append(ToyRollouts(engine, prompt_ids, range(40, 140)))
            return made[-1]

        torch.manual_seed(0)
        return train_trl(recipe, rows=rows, model_dir=model_dir, out_dir=work, rollouts_factory=factory,
                         **tracking)  # fmt: skip

    monkeypatch.setattr(worker, "trl_in_process", trl_in_process)
    return made


@pytest.fixture
def model_dir(tmp_path):
    from sweflow.offline.tiny_model import tiny_model_path

    dest = tmp_path / "models" / "hf"
    shutil.copytree(tiny_model_path(), dest)
    return dest


def _run(tmp_path, model_dir, caplog, **train):
    from sweflow.config import check

    cfg = check({"train": {**TRAIN, **train}}, {})
    tasks = tmp_path / "tasks.valid.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in _rows(2)))
    (tmp_path / "map.json").write_text("{}")
    out = tmp_path / "grpo"
    outputs = {k: str(out / n) for k, n in (("summary", "summary.json"), ("metrics", "metrics.jsonl"),
                                            ("rollouts", "rollouts"), ("final", "final"))}  # fmt: skip
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sweflow.train"):
        summary = stage.train_grpo_step(tasks, model_dir, tmp_path / "map.json", outputs,
                                        train=cfg["train"], sandbox=cfg["sandbox"], provider="local")  # fmt: skip
    metrics = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    return summary, metrics, caplog.text


def _final(tmp_path):
    from safetensors.torch import load_file

    return load_file(str(next((tmp_path / "grpo" / "final").glob("*.safetensors"))))


def test_a_kill_during_a_save_resumes_from_the_last_complete_checkpoint(tmp_path, model_dir, toy_engine,
                                                                        caplog):  # fmt: skip
    first, steps, _ = _run(tmp_path, model_dir, caplog)
    assert first["resumed_from_step"] is None and steps == [1, 2]
    # the partial checkpoint-2: a 5 KB optimizer.pt, no trainer_state.json, no completion marker
    ckpt = tmp_path / "grpo" / "work" / "checkpoints" / "checkpoint-2"
    for name in ("trainer_state.json", "sweflow-complete.json"):
        (ckpt / name).unlink(missing_ok=True)
    (ckpt / "optimizer.pt").write_bytes((ckpt / "optimizer.pt").read_bytes()[:5000])

    again, steps, log = _run(tmp_path, model_dir, caplog)
    assert "checkpoint-2 is partial" in log and "resuming from checkpoint-1" in log, log
    assert "over at step 0" not in log
    assert again["resumed_from_step"] == 1 and again["steps"] == 2 and steps == [1, 2]
    assert len(toy_engine[-1].calls) == 8  # only step 2 sampled again
    # and the new checkpoint-2 is complete: a third run finds the run done
    third, _, log = _run(tmp_path, model_dir, caplog)
    assert third["resumed_from_step"] == 2 and "reusing its final weights" in log, log


def test_a_partial_checkpoint_with_its_marker_but_a_file_cut_short_is_skipped(tmp_path, model_dir, toy_engine,
                                                                              caplog):  # fmt: skip
    from sweflow.train.resume import checkpoint_problem

    _run(tmp_path, model_dir, caplog)
    ckpt = tmp_path / "grpo" / "work" / "checkpoints" / "checkpoint-2"
    assert checkpoint_problem(ckpt) is None
    (ckpt / "model.safetensors").write_bytes(b"cut")
    assert "model.safetensors" in checkpoint_problem(ckpt)


def test_new_starting_weights_train_from_step_0_and_publish_new_weights(tmp_path, model_dir, toy_engine,
                                                                        caplog):  # fmt: skip
    from safetensors.torch import load_file, save_file

    first, _, _ = _run(tmp_path, model_dir, caplog)
    old_final = _final(tmp_path)
    # a new warm start: other weights in the same folder
    weights = next(model_dir.glob("*.safetensors"))
    state = load_file(str(weights))
    name = sorted(state)[0]
    state[name] = state[name] + 0.5
    save_file(state, str(weights), metadata={"format": "pt"})

    again, steps, log = _run(tmp_path, model_dir, caplog)
    assert "over at step 0: the starting weights changed" in log, log
    assert again["resumed_from_step"] is None and again["steps"] == 2 and steps == [1, 2]
    assert len(toy_engine[-1].calls) == 16  # both steps sampled again
    assert again["starting_weights_sha256"] != first["starting_weights_sha256"]
    new_final = _final(tmp_path)
    assert any(not torch.equal(old_final[k], new_final[k]) for k in old_final)
    assert again["final_weights"] != first["final_weights"]


def test_an_operational_knob_keeps_the_checkpoints_and_the_run_resumes(tmp_path, model_dir, toy_engine,
                                                                       caplog):  # fmt: skip
    _run(tmp_path, model_dir, caplog)
    # killed before the save of step 2
    shutil.rmtree(tmp_path / "grpo" / "work" / "checkpoints" / "checkpoint-2")
    again, steps, log = _run(tmp_path, model_dir, caplog, rollout={"max_concurrency": 4},
                             verl={"gpu_memory_utilization": 0.5, "ray_port": 6390},
                             tracking={"wandb": {"project": "elsewhere"}})  # fmt: skip
    assert "over at step 0" not in log, log
    assert "resuming from checkpoint-1" in log, log
    assert again["resumed_from_step"] == 1 and steps == [1, 2]
    assert len(toy_engine[-1].calls) == 8
    # the run's TensorBoard curves: step 2 of the killed attempt is purged, the resumed step 2 shown once
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "grpo" / "tensorboard" / "sweflow"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("sweflow/reward_mean")] == [1, 2]
    assert "sweflow/dataset_shas/text_summary" in acc.Tags()["tensors"]


def test_the_starting_weights_hash_reads_a_download_manifest_only_while_it_names_the_folder(tmp_path):
    from sweflow.models.hub import model_manifest
    from sweflow.train.resume import weights_sha256

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"weights")
    by_files = weights_sha256(hf)
    manifest = tmp_path / "hf.manifest.json"
    manifest.write_text(json.dumps(model_manifest(hf, repo_id="o/m", sha="a" * 40)))
    assert weights_sha256(hf) == by_files  # the manifest's sha256s, without reading the weights
    (hf / "model.safetensors").write_bytes(b"other weights")  # replaced by hand: the manifest is stale
    assert weights_sha256(hf) not in (by_files, None)


def test_the_fingerprint_leaves_out_operational_keys_and_names_what_changed():
    from sweflow.config import check
    from sweflow.train.resume import fingerprint_changes, recipe_values

    base = check({"train": dict(TRAIN)}, {})["train"]
    knobs = check({"train": {**TRAIN, "rollout": {"max_concurrency": 9}, "proxy": {"port": 9999},
                             "verl": {"gpu_memory_utilization": 0.3, "ray_port": 7000}}}, {})["train"]  # fmt: skip
    assert recipe_values(knobs) == recipe_values(base)
    lr = check({"train": {**TRAIN, "optim": {"lr": 1e-3, "weight_decay": 0.0}}}, {})["train"]
    old = {"format": 2, "recipe": recipe_values(base), "weights": "a", "tasks": "t"}
    new = {"format": 2, "recipe": recipe_values(lr), "weights": "b", "tasks": "t"}
    assert fingerprint_changes(old, new) == ["the recipe (train.optim.lr)", "the starting weights"]
    assert fingerprint_changes({"lr": 1}, new) == ["the fingerprint's format (state of an older sweflow)"]
