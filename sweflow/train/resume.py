"""When a GRPO or SFT run may resume: `run_fingerprint` / `sft_fingerprint`, what its checkpoints were made
from (work/recipe.json, `prepare_work`), `fingerprint_changes` in words, and `last_complete_checkpoint`.

A run resumes only while its fingerprint is unchanged and only from a complete checkpoint (see above each).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..params import result_values
from ..util import atomic_write, read_json, sha256_bytes, sha256_file, stable_json, tree_files

log = logging.getLogger("sweflow.train")

# The fingerprint: the starting weights, the task rows it trains on, the result keys of its `train` and
# `sandbox` sections (config/keys.yaml; operational knobs are left out, so raising concurrency keeps the
# checkpoints) and the training code (sweflow/train and the libraries that train). Keys that reach the run
# only through another input are left out of the recipe part: the model's repo and revision and the warm
# start (through the weights), `instances` (through the rows).
FORMAT = 2  # 1: the recipe's hyperparameters alone (operational ones included)

# train keys that reach the run only through its weights or its rows
_THROUGH_INPUTS = ("enabled", "instances", "warm_start")
_MODEL_KEPT = ("megatron",)  # of train.model: the Megatron conversion is made from the same weights

# the libraries whose version changes what a step computes
TRAINING_LIBRARIES = ("torch", "transformers", "trl", "accelerate", "verl", "megatron-core", "vllm")


def _files_sha256(files: Mapping[str, str]) -> str:
    """One hash over {relative path: sha256}, in path order (a manifest's and a folder's agree)."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + files[rel].encode() + b"\n")
    return h.hexdigest()


def weights_sha256(model_dir: str | os.PathLike) -> str:
    """Hash of the folder the run starts from. A downloaded model's manifest beside it (`<dir>.manifest.json`,
    sha256 per file) is used while it still names the folder's files and sizes; otherwise every file is read
    (a warm start's or SFT's output folder)."""
    from ..models.hub import HF_LOCAL_CACHE

    root = Path(model_dir)
    sizes = {
        f.relative_to(root).as_posix(): f.stat().st_size
        for f in tree_files(root)
        if f.relative_to(root).parts[0] != HF_LOCAL_CACHE
    }
    manifest = root.with_name(root.name + ".manifest.json")
    if manifest.is_file():
        files = read_json(manifest).get("files") or {}
        if sizes == {rel: f.get("size") for rel, f in files.items()}:
            return _files_sha256({rel: f["sha256"] for rel, f in files.items()})
    return _files_sha256({rel: sha256_file(root / rel) for rel in sizes})


def code_fingerprint() -> dict[str, Any]:
    """The sweflow.train sources' hash and the versions of the training libraries installed."""
    from ..provenance.environment import installed_versions, sweflow_tree_sha256

    return {"sweflow.train": sweflow_tree_sha256("train"), **installed_versions(TRAINING_LIBRARIES)}


def recipe_values(train: Mapping[str, Any]) -> dict[str, Any]:
    """The `train` section's result keys that make a step's result (see the module docstring)."""
    values = dict(result_values(train, "train") or {})
    for key in _THROUGH_INPUTS:
        values.pop(key, None)
    model = values.pop("model", None) or {}
    kept = {k: model[k] for k in _MODEL_KEPT if k in model}
    if kept:
        values["model"] = kept
    return values


def run_fingerprint(
    *,
    train: Mapping[str, Any],
    sandbox: Mapping[str, Any],
    provider: str,
    rows: Sequence[Mapping[str, Any]],
    model_dir: str | os.PathLike,
) -> dict[str, Any]:
    """What a run's checkpoints were made from (byte-stable: written as work/recipe.json)."""
    return {
        "format": FORMAT,
        "recipe": recipe_values(train),
        "sandbox": {"provider": provider, **(result_values(sandbox, "sandbox") or {})},
        "tasks": sha256_bytes(stable_json(list(rows))),
        "weights": weights_sha256(model_dir),
        "code": code_fingerprint(),
    }


def prepare_work(work: Path, fingerprint: Mapping[str, Any], section: str = "train") -> Path:
    """The run's working folder `work` (made); emptied, with one log line naming what changed, when its
    checkpoints were made from other inputs (`run_fingerprint`, `sft_fingerprint`; kept as work/recipe.json).
    `section`: the config section the recipe part's keys are named under in that line."""
    work, run_dir = Path(work), Path(work).parent
    marker = work / "recipe.json"
    text = stable_json(fingerprint) + "\n"
    if marker.exists() and marker.read_text() != text:
        try:
            old = json.loads(marker.read_text())
        except ValueError:
            old = None
        changes = fingerprint_changes(old, fingerprint, section) or ["its fingerprint"]
        log.warning(
            "starting %s over at step 0: %s changed since its checkpoints", run_dir, "; ".join(changes)
        )
        shutil.rmtree(work)
    elif work.exists() and not marker.exists() and any(work.iterdir()):
        log.warning("starting %s over at step 0: its state has no fingerprint (work/recipe.json)", run_dir)
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    if not marker.exists():
        atomic_write(marker, text)
    return work


def sft_fingerprint(
    *, train: Mapping[str, Any], messages: str | os.PathLike, model_dir: str | os.PathLike
) -> dict[str, Any]:
    """What an SFT run's checkpoints were made from: the `sft.train` result keys (operational ones left
    out), the messages file's bytes, the starting weights and the training code."""
    return {
        "format": FORMAT,
        "recipe": result_values(train, "sft.train"),
        "tasks": sha256_file(Path(messages)),
        "weights": weights_sha256(model_dir),
        "code": code_fingerprint(),
    }


_PARTS = {
    "recipe": "the recipe",
    "sandbox": "the sandbox settings",
    "tasks": "the task rows",
    "weights": "the starting weights",
    "code": "the training code",
}


def _leaves(node: Any, path: tuple[str, ...] = ()) -> dict[str, Any]:
    if isinstance(node, Mapping) and node:
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_leaves(v, (*path, str(k))))
        return out
    return {".".join(path): node}


def fingerprint_changes(old: Any, new: Mapping[str, Any], section: str = "train") -> list[str]:
    """What differs between a stored fingerprint and the run's, in words ([] when nothing does); the
    recipe's keys are named under `section`."""
    if not isinstance(old, Mapping) or old.get("format") != new.get("format"):
        return ["the fingerprint's format (state of an older sweflow)"]
    out = []
    for part, words in _PARTS.items():
        if old.get(part) == new.get(part):
            continue
        if isinstance(new.get(part), Mapping) and isinstance(old.get(part), Mapping):
            a, b = _leaves(old[part]), _leaves(new[part])
            keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            prefix = f"{section}." if part == "recipe" else "sandbox." if part == "sandbox" else ""
            shown = ", ".join(f"{prefix}{k}" for k in keys[:4]) + (", ..." if len(keys) > 4 else "")
            out.append(f"{words} ({shown})")
        else:
            out.append(words)
    return out


# A checkpoint is complete only with its marker, which SweflowGRPOTrainer writes after TRL's save returned on
# every process (model, optimizer, scheduler, RNG states, trainer_state.json), naming each file and its size:
# a folder without it, or with a file missing or cut short, was being written when the job died.
CHECKPOINT_DONE = "sweflow-complete.json"


def _checkpoint_step(path: Path) -> int:
    return int(path.name.rsplit("-", 1)[-1])


def checkpoint_problem(path: Path) -> str | None:
    """Why the checkpoint folder `path` is not complete (None: it is)."""
    marker = path / CHECKPOINT_DONE
    if not marker.is_file():
        return f"no {CHECKPOINT_DONE}"
    try:
        files = json.loads(marker.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError, TypeError):
        return f"an unreadable {CHECKPOINT_DONE}"
    for name, size in sorted(files.items()):
        f = path / name
        if not f.is_file() or f.stat().st_size != size:
            return f"{name} missing or not {size} bytes"
    return None


def checkpoint_folders(ckpt_dir: Path) -> list[Path]:
    """The checkpoint-<step> folders of `ckpt_dir`, newest step first."""
    found = [p for p in ckpt_dir.glob("checkpoint-*") if p.is_dir() and p.name.rsplit("-", 1)[-1].isdigit()]
    return sorted(found, key=_checkpoint_step, reverse=True)


def last_complete_checkpoint(ckpt_dir: Path, *, remove_partial: bool = False) -> Path | None:
    """The newest complete checkpoint; each newer partial one is logged and skipped (removed with
    `remove_partial`: only one process may, before the run's processes start)."""
    for path in checkpoint_folders(ckpt_dir):
        why = checkpoint_problem(path)
        if why is None:
            return path
        log.warning("%s is partial (%s: its save was cut off): %s it", path.name, why,
                    "removing" if remove_partial else "skipping")  # fmt: skip
        if remove_partial:
            shutil.rmtree(path)
    return None


def write_checkpoint_marker(path: Path, step: int) -> None:
    """Mark the checkpoint folder `path` complete: every file in it and its size (written last)."""
    files = {f.relative_to(path).as_posix(): f.stat().st_size
             for f in sorted(path.rglob("*")) if f.is_file() and f.name != CHECKPOINT_DONE}  # fmt: skip
    atomic_write(path / CHECKPOINT_DONE, json.dumps({"step": step, "files": files}, sort_keys=True) + "\n")
