"""sweflow.models.megatron on CPU: the torchrun command, the converter entry points it names, the parallel-size
checks, the torch_dist layout check, the atomic publish around a converter run, and the one-line error when the
GPU stack is missing (the conversion itself needs envs/train-verl.yaml and a GPU)."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from sweflow.errors import ConfigError
from sweflow.models.hub import ModelError
from sweflow.models.megatron import (
    GPU_ENV,
    checkpoint_layout,
    gpu_stack_problem,
    megatron_convert_command,
    run_megatron_convert,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _opt(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize(
    ("converter", "tp", "pp"), [("mbridge", 2, 1), ("megatron-bridge", 2, 2), ("verl", 1, 4)]
)
def test_command_is_torchrun_with_one_process_per_gpu(converter, tp, pp):
    argv = megatron_convert_command(
        "/m/hf", "/m/torch_dist", tp=tp, pp=pp, gpus=tp * pp, python="/env/bin/python", converter=converter
    )
    assert argv[:3] == ["/env/bin/python", "-m", "torch.distributed.run"]
    assert _opt(argv, "--nproc_per_node") == str(tp * pp) and _opt(argv, "--nnodes") == "1"
    # torchrun's own options come before the module; the module's after it.
    module_at = argv.index("-m", 3)
    assert argv[module_at + 1] == "sweflow.models.megatron" and argv.index("--nproc_per_node") < module_at
    assert _opt(argv, "--converter") == converter
    assert (_opt(argv, "--tp"), _opt(argv, "--pp")) == (str(tp), str(pp))
    assert (_opt(argv, "--hf-dir"), _opt(argv, "--out-dir")) == ("/m/hf", "/m/torch_dist")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tp": 2, "pp": 1, "gpus": 1}, "train.model.megatron.gpus"),
        ({"tp": 1, "pp": 1, "gpus": 0}, "train.model.megatron.gpus"),
        ({"tp": 2, "pp": 1, "gpus": 2, "converter": "verl"}, "train.model.megatron.converter"),
        ({"tp": 1, "pp": 1, "gpus": 1, "converter": "nemo"}, "train.model.megatron.converter"),
    ],
)
def test_impossible_parallel_layouts_are_config_errors(kwargs, field):
    with pytest.raises(ConfigError) as exc:
        megatron_convert_command("/hf", "/out", **kwargs)
    assert field in str(exc.value) and "\n" not in str(exc.value)


def test_the_command_really_launches_the_entry_point_and_says_what_is_missing(tmp_path):
    """torchrun (this venv's) accepts the options and runs `-m sweflow.models.megatron`, which stops with the
    GPU-environment line because megatron.core is not installed here."""
    if importlib.util.find_spec("megatron") is not None:
        pytest.skip("the GPU stack is installed here")
    argv = megatron_convert_command(tmp_path / "hf", tmp_path / "out", tp=1, gpus=1, python=sys.executable)
    res = subprocess.run(
        argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=240, env={"PATH": "/usr/bin:/bin"}
    )
    assert res.returncode != 0
    assert f"sweflow: the mbridge conversion needs the GPU environment {GPU_ENV}" in res.stderr
    assert not (tmp_path / "out").exists()


def test_verl_wheel_ships_the_converter_the_verl_runner_calls():
    spec = importlib.util.find_spec("scripts.converter_hf_to_mcore")
    if spec is None or importlib.util.find_spec("verl") is None:
        pytest.skip("verl is not installed")
    assert spec.origin and "site-packages" in spec.origin  # the wheel's module, not a repo folder
    tree = ast.parse(Path(spec.origin).read_text())
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    args = [a.arg for a in funcs["convert_hf_to_mcore"].args.args]
    assert args[:3] == ["hf_model_path", "output_path", "pp_size"]


def test_missing_gpu_stack_is_one_line_and_nothing_is_written(tmp_path):
    if importlib.util.find_spec("megatron") is not None:
        pytest.skip("the GPU stack is installed here")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert "needs the GPU environment" in gpu_stack_problem("megatron-bridge", sys.executable)
    with pytest.raises(ModelError) as exc:
        run_megatron_convert(hf, tmp_path / "out", python=sys.executable, converter="megatron-bridge")
    msg = str(exc.value)
    assert "\n" not in msg and f"needs the GPU environment {GPU_ENV}" in msg and "megatron.bridge" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def _write_flat(folder: Path, shards: int = 2) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".metadata").write_bytes(b"meta")
    (folder / "common.pt").write_bytes(b"common")
    for i in range(shards):
        (folder / f"__{i}_0.distcp").write_bytes(b"shard")


def test_checkpoint_layout_reads_flat_and_iteration_layouts(tmp_path):
    _write_flat(tmp_path / "flat")
    assert checkpoint_layout(tmp_path / "flat") == {
        "format": "torch_dist",
        "load_path": str(tmp_path / "flat"),
        "iteration": None,
        "shards": 2,
    }
    _write_flat(tmp_path / "mb" / "iter_0000000", shards=1)
    (tmp_path / "mb" / "latest_checkpointed_iteration.txt").write_text("0\n")
    layout = checkpoint_layout(tmp_path / "mb")
    assert layout["load_path"] == str(tmp_path / "mb" / "iter_0000000") and layout["iteration"] == 0
    (tmp_path / "mb" / "latest_checkpointed_iteration.txt").write_text("7")
    with pytest.raises(ModelError, match="iter_0000007/"):
        checkpoint_layout(tmp_path / "mb")
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / ".metadata").write_bytes(b"meta")
    with pytest.raises(ModelError, match="not a torch_dist checkpoint"):
        checkpoint_layout(tmp_path / "bare")


class _FakeConverter:
    """Stands in for torchrun: writes what Megatron-Bridge writes (or not) into the argv's --out-dir."""

    def __init__(self, rc: int = 0, complete: bool = True) -> None:
        self.rc, self.complete, self.argv = rc, complete, None

    def __call__(self, argv):
        self.argv = argv
        out = Path(_opt(argv, "--out-dir"))
        _write_flat(out / "iter_0000000", shards=1 if self.complete else 0)
        (out / "latest_checkpointed_iteration.txt").write_text("0")
        return subprocess.CompletedProcess(
            argv, self.rc, "", "loading...\nRuntimeError: CUDA out of memory\n"
        )


@pytest.fixture
def hf_dir(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "qwen3"}')
    return hf


def test_run_converts_into_a_temp_folder_then_renames_it_into_place(tmp_path, hf_dir):
    out = tmp_path / "models" / "tiny" / "torch_dist"
    _write_flat(out)  # a previous conversion: replaced, not merged
    fake = _FakeConverter()
    result = run_megatron_convert(hf_dir, out, tp=2, pp=1, gpus=2, converter="megatron-bridge", runner=fake)
    assert Path(_opt(fake.argv, "--out-dir")) != out  # the converter never writes the destination itself
    assert _opt(fake.argv, "--nproc_per_node") == "2"
    assert result["load_path"] == str(out / "iter_0000000") and result["converter"] == "megatron-bridge"
    assert (result["tp"], result["pp"], result["gpus"], result["shards"]) == (2, 1, 2, 1)
    assert not (out / "__1_0.distcp").exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["torch_dist"]


@pytest.mark.parametrize(
    ("fake", "needle"),
    [
        (_FakeConverter(rc=1), "exited 1: RuntimeError: CUDA out of memory"),
        (_FakeConverter(complete=False), "not a"),
    ],
)
def test_a_failed_or_incomplete_conversion_leaves_no_output(tmp_path, hf_dir, fake, needle):
    out = tmp_path / "models" / "torch_dist"
    with pytest.raises(ModelError) as exc:
        run_megatron_convert(hf_dir, out, converter="megatron-bridge", runner=fake)
    assert needle in str(exc.value) and "\n" not in str(exc.value)
    assert list(out.parent.iterdir()) == []


def test_run_refuses_a_folder_that_is_not_a_hf_model(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        run_megatron_convert(tmp_path, tmp_path / "out", runner=_FakeConverter())
