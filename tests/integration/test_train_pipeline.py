"""The embedded default trains for real: `make run`'s pipeline in a fresh folder (tests/integration/conftest.py) runs the whole chain (local Hub
-> tasks -> templates -> validation -> e2e check -> tiny model from the Hub -> warm start -> GRPO with real
rollouts: Claude Code in local sandboxes through the proxy, fresh evaluation) and its outputs hold up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import EMBEDDED_CONFIGS

pytestmark = [pytest.mark.integration, pytest.mark.claude]
ROOT = Path(__file__).resolve().parents[2]
RUN = "results/sample/grpo/tiny"


@pytest.fixture(scope="module")
def trained(embedded_local_run):
    return embedded_local_run


def test_metrics_are_present_and_their_counts_add_up(trained):
    metrics = [json.loads(x) for x in (trained / RUN / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["samples"] == 8 == m["completed"] + m["aborted"]
        assert m["aborted"] == sum(m["aborted_by_reason"].values())
        assert m["groups"] == 1 == m["groups_with_gradient"] + m["groups_without_gradient"]
        for key in ("policy_loss", "kl", "clip_fraction", "tis_weight_mean", "tis_clipped_share", "entropy",
                    "grad_norm", "lr", "rollout_s", "train_s", "weight_sync_s", "tokens_per_s"):  # fmt: skip
            assert m[key] is not None, key
        rec = [
            json.loads(x)
            for x in (trained / RUN / "rollouts" / f"step-{m['rollout_step']}.jsonl").read_text().splitlines()
        ]
        assert len(rec) == 8 and sum(r["aborted"] for r in rec) == m["aborted"]
        done = [r["reward"] for r in rec if not r["aborted"]]
        assert m["reward_mean"] == pytest.approx(sum(done) / len(done))
    # the update is not a no-op: some group had reward variance
    assert sum(m["groups_with_gradient"] for m in metrics) >= 1


def test_rollout_records_hold_no_secret_and_no_gold_patch(trained):
    from sweflow.sample import load_task

    gold = load_task("sweflow__calclib-3")["patch"]
    text = "".join(p.read_text() for p in (trained / RUN / "rollouts").iterdir())
    assert "diff --git" not in text and gold not in text
    assert "sk-" not in text and "token" not in text.lower().replace("tokens", "")


def test_weights_changed_and_the_final_checkpoint_loads_and_generates(trained):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = load_file(
        str(next((trained / "results/sample/warm_start/sweflow--tiny-qwen3-swa/hf").glob("*.safetensors")))
    )
    final = load_file(str(next((trained / RUN / "final").glob("*.safetensors"))))
    moved = [k for k in start if not torch.equal(start[k], final[k])]
    assert moved, "GRPO left every weight as the warm start had it"
    model = AutoModelForCausalLM.from_pretrained(str(trained / RUN / "final"))
    tok = AutoTokenizer.from_pretrained(str(trained / RUN / "final"))
    ids = tok("Fix the bug.", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > ids.shape[1]
    summary = json.loads((trained / RUN / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["checkpoints"] and summary["final_weights"]
    assert summary["processes"] == 2  # tests/fixtures/two_nodes.yaml: 2 data-parallel processes here


def test_an_update_from_the_warm_start_follows_the_advantages(trained, tmp_path):
    """Weights that moved can be AdamW's decay alone: one update of the embedded recipe from the embedded
    run's warm start must make rewarded completions likelier and zero-reward ones less likely than the same
    update with the advantages zeroed (tests/fixtures/grpo_probe.py)."""
    from sweflow.config import load_config
    from sweflow.train.recipe import Recipe
    from tests.fixtures.grpo_probe import probe

    warm = trained / "results/sample/warm_start/sweflow--tiny-qwen3-swa/hf"
    recipe = Recipe.from_config(load_config(*EMBEDDED_CONFIGS)["train"])
    figures = probe(warm, recipe, tmp_path)
    assert figures["rewarded_vs_control"] > 0 > figures["zero_reward_vs_control"], figures


def test_a_second_run_does_nothing(trained):
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(trained),
           "--workflow-profile", "none", "--cores", "2", "-n", "train", "--configfile", *EMBEDDED_CONFIGS]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "Nothing to be done" in res.stdout + res.stderr, res.stdout[-2000:]
