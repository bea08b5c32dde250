"""Hugging Face weights -> a Megatron distributed (`torch_dist`) checkpoint, for verl's Megatron engine.

Three real converters (`mbridge`, `megatron-bridge`, `verl`: see above CONVERTERS), each run under torchrun
by this module's entry point. All of it needs the GPU environment (envs/train-verl.yaml); elsewhere it
fails with one line saying so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..schema import default
from ..util import replace_folder, run_cmd
from .hub import ModelError

# Three real converters, each run under torchrun (one process per GPU) by this module's entry point (`python
# -m torch.distributed.run ... -m sweflow.models.megatron --converter NAME ...`):
#
# - `mbridge`: the mbridge package (verl's `vanilla_mbridge` backend): `AutoBridge.from_pretrained(hf)`,
#   `get_model()`, `load_weights()`, then `megatron.core.dist_checkpointing.save` -> `.metadata` + `*.distcp`
#   directly in the output folder.
# - `megatron-bridge`: NVIDIA Megatron-Bridge (verl's default `use_mbridge` backend):
#   `AutoBridge.from_hf_pretrained(hf).to_megatron_provider(load_weights=True)`, then `save_megatron_model` ->
#   `latest_checkpointed_iteration.txt` + `iter_0000000/` holding `.metadata` + `*.distcp`.
# - `verl`: verl's own converter, shipped in the verl wheel as the top-level module
#   `scripts.converter_hf_to_mcore` (`convert_hf_to_mcore(hf, out, pp_size=...)`); flat layout like mbridge.
#   It always converts with TP=1 and, for dense models, on one process only.
CONVERTERS = ("mbridge", "megatron-bridge", "verl")
# What each converter imports (checked before the run, in the interpreter that will run it).
CONVERTER_MODULES = {
    "mbridge": ("megatron.core", "mbridge"),
    "megatron-bridge": ("megatron.core", "megatron.bridge"),
    "verl": ("megatron.core", "scripts.converter_hf_to_mcore"),
}
# All of it needs the GPU environment (envs/train-verl.yaml: torch with CUDA, megatron-core,
# transformer-engine, mbridge / megatron-bridge); elsewhere it fails with one line saying so.
GPU_ENV = "envs/train-verl.yaml"
ENTRY_MODULE = "sweflow.models.megatron"
ITERATION_FILE = "latest_checkpointed_iteration.txt"


def _check_parallel(converter: str, tp: int, pp: int, gpus: int) -> None:
    if converter not in CONVERTERS:
        raise ConfigError(
            f"unknown converter {converter!r}",
            field="train.model.megatron.converter",
            hint=f"one of {CONVERTERS}",
        )
    if min(tp, pp, gpus) < 1:
        raise ConfigError(
            f"tp={tp}, pp={pp}, gpus={gpus}: each must be >= 1", field="train.model.megatron.gpus"
        )
    if converter == "verl" and tp != 1:
        raise ConfigError(
            "verl's converter writes TP=1 only (the torch_dist checkpoint is resharded at load: convert with tp=1)",
            field="train.model.megatron.converter",
        )
    if gpus != tp * pp:
        raise ConfigError(
            f"the conversion runs one process per GPU: gpus={gpus} must equal tp*pp={tp * pp}",
            field="train.model.megatron.gpus",
        )


def megatron_convert_command(
    hf_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    tp: int,
    pp: int = 1,
    gpus: int,
    python: str = "python",
    converter: str = default("train.model.megatron.converter"),
) -> list[str]:
    """The argv that converts `hf_dir` into `out_dir`: torchrun (as `python -m torch.distributed.run`, so the
    GPU environment's own interpreter and torch run it) with `gpus` processes on this node, each running this
    module's entry point with the converter and the TP/PP sizes."""
    _check_parallel(converter, tp, pp, gpus)
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc_per_node",
        str(gpus),
        "-m",
        ENTRY_MODULE,
        "--converter",
        converter,
        "--hf-dir",
        str(hf_dir),
        "--out-dir",
        str(out_dir),
        "--tp",
        str(tp),
        "--pp",
        str(pp),
    ]


def gpu_stack_problem(converter: str, python: str = "python", timeout: float = 120) -> str | None:
    """None when `python` can import what `converter` needs, else the problem (one line)."""
    mods = CONVERTER_MODULES[converter]
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)"
    try:
        res = run_cmd([python, "-c", code, *mods], timeout=timeout, env=_child_env())
        ok, detail = res.returncode == 0, (res.stderr.strip().splitlines() or [""])[-1]
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    if ok:
        return None
    return (
        f"the {converter} conversion needs the GPU environment {GPU_ENV} "
        f"({', '.join(mods)} not importable by {python}){': ' + detail if detail else ''}"
    )


def _child_env() -> dict[str, str]:
    """This environment with the folder holding the sweflow package first on PYTHONPATH (the GPU env may not
    have sweflow installed)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


# A torch_dist checkpoint is resharded when loaded, so the conversion's TP/PP need not match the training's;
# `checkpoint_layout` finds the folder that holds it (verl's `actor.megatron.dist_checkpointing_path`).
def checkpoint_layout(path: str | os.PathLike) -> dict[str, Any]:
    """{"format": "torch_dist", "load_path": folder with `.metadata`, "iteration": int | None, "shards": n}.

    Accepts the flat layout (`.metadata` + `*.distcp` in `path`) and Megatron's training layout
    (`latest_checkpointed_iteration.txt` naming `iter_NNNNNNN/` or `release/`). ModelError when neither is
    complete.
    """
    root = Path(path)
    iteration: int | None = None
    folder = root
    marker = root / ITERATION_FILE
    if marker.is_file():
        text = marker.read_text().strip()
        if text == "release":
            folder = root / "release"
        elif text.isdigit():
            iteration = int(text)
            folder = root / f"iter_{iteration:07d}"
        else:
            raise ModelError(f"{ITERATION_FILE} holds {text!r}, not an iteration", file=str(root))
    shards = sorted(p.name for p in folder.glob("*.distcp")) if folder.is_dir() else []
    if not (folder / ".metadata").is_file() or not shards:
        raise ModelError(
            "not a torch_dist checkpoint (needs .metadata and *.distcp shards"
            + (f" in {folder.name}/, named by {ITERATION_FILE})" if folder != root else ")"),
            file=str(root),
            field="train.model.megatron",
        )
    return {"format": "torch_dist", "load_path": str(folder), "iteration": iteration, "shards": len(shards)}


# `run_megatron_convert` writes into a temporary folder beside the destination and renames it into place after
# checking that layout.
def run_megatron_convert(
    hf_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    tp: int = 1,
    pp: int = 1,
    gpus: int = default("train.model.megatron.gpus"),
    python: str = "python",
    converter: str = default("train.model.megatron.converter"),
    timeout: float = 3 * 3600,
    runner: Callable[[list[str]], Any] | None = None,
) -> dict[str, Any]:
    """Convert `hf_dir` into `out_dir` (replaced atomically); return {converter, tp, pp, gpus, **layout}.

    Fails with one ModelError line when `python` lacks the GPU stack, when the converter exits non-zero (its last
    stderr line) or when its output is not a complete torch_dist checkpoint; no partial `out_dir` is left.
    `runner(argv)` (default: run_cmd with `timeout`) must return an object with returncode/stdout/stderr.
    """
    _check_parallel(converter, tp, pp, gpus)
    if not (Path(hf_dir) / "config.json").is_file():
        raise ModelError(
            "no config.json: not a Hugging Face model folder", file=str(hf_dir), field="train.model"
        )
    if runner is None:
        if problem := gpu_stack_problem(converter, python):
            raise ModelError(problem, field="train.model.megatron")
        env = _child_env()

        def runner(argv: list[str]) -> Any:
            return run_cmd(argv, timeout=timeout, env=env)

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.convert-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    argv = megatron_convert_command(hf_dir, tmp, tp=tp, pp=pp, gpus=gpus, python=python, converter=converter)
    try:
        res = runner(argv)
        if res.returncode != 0:
            lines = [ln for ln in (res.stderr or res.stdout or "").splitlines() if ln.strip()]
            raise ModelError(
                f"the {converter} converter exited {res.returncode}: {lines[-1].strip() if lines else 'no output'}",
                file=str(hf_dir),
                field="train.model.megatron",
            )
        checkpoint_layout(tmp)  # complete before it is published
        replace_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"converter": converter, "tp": tp, "pp": pp, "gpus": gpus, **checkpoint_layout(out)}


# ---- the torchrun entry point (runs in the GPU environment) -------------------------------------------------
def _init_distributed(tp: int, pp: int) -> None:
    import torch

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="nccl")
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(0)


def _convert_mbridge(hf_dir: str, out_dir: str, tp: int, pp: int) -> None:
    from mbridge import AutoBridge
    from megatron.core import dist_checkpointing

    _init_distributed(tp, pp)
    bridge = AutoBridge.from_pretrained(hf_dir)
    model = bridge.get_model(wrap_with_ddp=False)
    if len(model) != 1:  # virtual pipeline chunks; the conversion sets no virtual pipeline size
        raise SystemExit(f"mbridge conversion: one model chunk per rank expected, got {len(model)}")
    bridge.load_weights(model, hf_dir)
    dist_checkpointing.save(model[0].sharded_state_dict(), out_dir)


def _convert_megatron_bridge(hf_dir: str, out_dir: str, tp: int, pp: int) -> None:
    import torch
    from megatron.bridge import AutoBridge

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="nccl")
    bridge = AutoBridge.from_hf_pretrained(hf_dir, torch_dtype=torch.bfloat16)
    provider = bridge.to_megatron_provider(load_weights=True)
    provider.tensor_model_parallel_size = tp
    provider.pipeline_model_parallel_size = pp
    provider.finalize()
    provider.initialize_model_parallel(seed=0)
    model = provider.provide_distributed_model(wrap_with_ddp=False)
    bridge.save_megatron_model(model, out_dir, hf_tokenizer_path=hf_dir)


def _convert_verl(hf_dir: str, out_dir: str, tp: int, pp: int) -> None:
    import scripts.converter_hf_to_mcore as verl_converter

    if getattr(verl_converter, "__file__", None) is None or not hasattr(
        verl_converter, "convert_hf_to_mcore"
    ):
        raise SystemExit(
            "scripts.converter_hf_to_mcore is not verl's converter (a scripts/ folder shadows it)"
        )
    verl_converter.convert_hf_to_mcore(hf_dir, out_dir, pp_size=pp)


_RUNNERS = {"mbridge": _convert_mbridge, "megatron-bridge": _convert_megatron_bridge, "verl": _convert_verl}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"torchrun -m {ENTRY_MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument("--converter", choices=CONVERTERS, required=True)
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        __import__("megatron.core")
        for mod in CONVERTER_MODULES[args.converter][1:]:
            __import__(mod)
    except ImportError as exc:
        print(
            f"sweflow: the {args.converter} conversion needs the GPU environment {GPU_ENV} ({exc})",
            file=sys.stderr,
        )
        return 2
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    _RUNNERS[args.converter](args.hf_dir, args.out_dir, args.tp, args.pp)
    import torch

    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
