"""benchmarks/gpu_check.py in its reduced mode: the one-GPU check's code at tiny sizes on CPU, so it cannot rot.

The check runs as it would on the GPU machine's image: every installed distribution that is neither on that
image (tests/fixtures/gpu_image.txt) nor among the carried wheels (benchmarks/gpu_wheels.txt) is hidden from
it, so a wheel missing from the list fails here, not in a session with 15 minutes of device time.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

HIDE = """
import importlib.abc, importlib.metadata, importlib.util, os, sys

def _norm(name):
    return name.lower().replace("_", "-").replace(".", "-")

_allowed = set(os.environ["GPU_IMAGE_ALLOW"].split(","))
_hidden = {top for top, dists in importlib.metadata.packages_distributions().items()
           if not any(_norm(d) in _allowed for d in dists)}
_hidden -= set(sys.stdlib_module_names) | set(sys.modules)

class _NotOnTheImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _hidden:
            raise ModuleNotFoundError(f"No module named {name!r} (not on the GPU image)", name=name)
        return None

sys.meta_path.insert(0, _NotOnTheImage())
_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: (
    None if name.partition(".")[0] in _hidden else _find_spec(name, package))
"""


def names(path: Path) -> set[str]:
    out = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.add(line.split("==")[0].strip().lower().replace("_", "-"))
    return out


def image_env(tmp_path: Path) -> dict:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDE)
    allow = names(ROOT / "tests" / "fixtures" / "gpu_image.txt") | names(
        ROOT / "benchmarks" / "gpu_wheels.txt"
    )
    return {**os.environ, "PYTHONPATH": str(site), "GPU_IMAGE_ALLOW": ",".join(sorted(allow | {"sweflow"}))}


def test_the_image_emulation_hides_what_the_gpu_machine_lacks(tmp_path):
    env = image_env(tmp_path)
    probe = "import importlib.util as u; print(u.find_spec('pydantic'), u.find_spec('trl') is not None)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == ["None", "True"], out.stderr
    bad = subprocess.run([sys.executable, "-c", "import pydantic"], capture_output=True, text=True, env=env)
    assert bad.returncode != 0 and "not on the GPU image" in bad.stderr


def test_the_reduced_gpu_check_runs_every_part_and_writes_its_figures(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), str(out), "--reduced", "--threads", "2"],
        capture_output=True, text=True, env=image_env(tmp_path), cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.strip().splitlines()[-1]
    figures = json.loads(out.read_text())
    assert json.loads(line) == figures and figures["reduced"] and figures["device"] == "cpu"
    parts = figures["parts"]
    assert set(parts) == {"peak", "model", "logprob", "grpo"} and not any(
        "error" in p for p in parts.values()
    ), parts

    # MFU is taken against what the peak part measured on this device (fp32 on CPU, bf16 on a GPU)
    peak = parts["peak"]
    assert peak["bf16_matmul_tflops"] > 0 and peak["max_tflops"] >= peak["bf16_matmul_tflops"]
    assert figures["mfu_against_tflops"] == peak["bf16_matmul_tflops"] and peak["datasheet_tflops"] is None

    model = parts["model"]
    assert model["peak_tflops"] == peak["bf16_matmul_tflops"]
    assert model["layers"] == 4 and model["gdn_kernel"] in ("fla", "torch") and model["dtype"] == "bfloat16"
    assert sorted(map(int, model["lengths"])) == [64, 128, 256]
    for n, row in model["lengths"].items():
        assert row["step_s"] > 0 and row["tokens_per_s"] == pytest.approx(int(n) / row["step_s"], rel=0.01)
        assert row["model_tflop"] > 0 and row["whole_head_step_s"] > 0

    lp = parts["logprob"]
    assert lp["decoded_tokens"] == 24 and lp["prompt_tokens"] == 32
    assert 0 <= lp["mean_abs_dlogp"] <= lp["p99_abs_dlogp"] <= lp["max_abs_dlogp"] < 1
    assert 0 <= lp["tis_clip_share_at_2"] <= 1 and math.isfinite(lp["tis_weight_mean"])
    assert 0 < lp["mean_entropy_nats"] < math.log(512)  # sharpened: below a flat distribution's

    grpo = parts["grpo"]
    assert grpo["steps"] == 2 and grpo["device"] == "cpu" and len(grpo["per_step"]) == 2
    for step in grpo["per_step"]:
        assert step["rollout_s"] > 0 and step["train_s"] > 0
        assert step["grad_norm"] >= 0 and math.isfinite(step["grad_norm"])
        # a group whose samples tie in reward has no advantage, so no gradient (the toy reward ties often)
        assert (step["grad_norm"] > 0) == (step["groups_with_gradient"] > 0), step
        assert step["tis_weight_mean"] > 0 and 0 <= step["tis_clipped_share"] <= 1
