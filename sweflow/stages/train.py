"""The train stage (rules/train.smk) as plain functions: model preparation (resolve, download, Megatron
checkpoint), the optional warm start, and the GRPO run on the validated tasks of one split.

The run's folder is results/<dataset>/grpo/<run>/. Its declared outputs (summary.json, metrics.jsonl,
rollouts/, final/) are published at the end; the working state (work/: checkpoints/, the live
metrics.jsonl and rollouts/) is not an output, so an interrupted run that Snakemake reruns resumes from
its last checkpoint. A changed recipe (work/recipe.json differs) starts over.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import TrainError
from ..rulekit import from_snakemake
from ..schema import default
from ..train.worker import proxy_settings as _proxy_settings
from ..util import (
    atomic_write,
    atomic_write_json,
    read_json,
    replace_folder,
    sha256_file,
    stable_json,
    write_if_changed,
)

__all__ = [
    "TrainError",
    "download_model_step",
    "from_snakemake",
    "megatron_checkpoint_step",
    "model_endpoint",
    "resolve_model_step",
    "train_grpo_step",
    "warm_start_step",
]

log = logging.getLogger("sweflow.train")


def model_endpoint(cfg: Mapping[str, Any]) -> str | None:
    """train.model.endpoint, where "dataset" means dataset.hub.endpoint."""
    endpoint = cfg["train"]["model"]["endpoint"]
    return cfg["dataset"]["hub"]["endpoint"] if endpoint == "dataset" else endpoint


@contextlib.contextmanager
def _model_hub(endpoint: str | None, repo_id: str) -> Iterator[str | None]:
    """The Hub to use; "local" serves the bundled store, publishing the tiny model `repo_id` names first."""
    from ..dataset.hub_client import hub_endpoint_env
    from .data import _env, hub_endpoint

    with hub_endpoint(endpoint, models=(repo_id,)) as url, _env(hub_endpoint_env(url)):
        yield url


def resolve_model_step(
    out: str | os.PathLike, *, repo_id: str, revision: str, endpoint: str | None, timeout: float = 60
) -> dict[str, Any]:
    """Write {repo_id, repo_type, revision, sha, source} (byte-stable; rewritten only when the sha moved)."""
    from ..dataset.hub_client import is_sha
    from ..models.hub import resolve_model

    source = "local-hub" if endpoint == "local" else None
    if is_sha(revision):
        rec = resolve_model(repo_id, revision, endpoint=None, timeout=timeout, source=source)
    else:
        with _model_hub(endpoint, repo_id) as url:
            rec = resolve_model(repo_id, revision, endpoint=url, timeout=timeout, source=source)
    write_if_changed(out, stable_json(rec) + "\n")
    log.info("model %s@%s -> %s", repo_id, revision, rec["sha"])
    return rec


def download_model_step(
    revision_file: str | os.PathLike,
    out_dir: str | os.PathLike,
    manifest_out: str | os.PathLike,
    *,
    endpoint: str | None,
    allow_patterns: Sequence[str],
    attempts: int = 4,
    timeout: float = 120,
) -> dict[str, Any]:
    """Snapshot the model at the resolved sha into `out_dir`; its manifest (sizes, sha256) to `manifest_out`."""
    from ..models.hub import download_model

    rev = read_json(revision_file)
    with _model_hub(endpoint, rev["repo_id"]) as url:
        manifest = download_model(
            rev["repo_id"],
            rev["sha"],
            out_dir,
            endpoint=url,
            allow_patterns=list(allow_patterns),
            attempts=attempts,
            timeout=timeout,
        )
    atomic_write_json(manifest_out, manifest)
    log.info(
        "downloaded %s@%s: %d files, %d bytes",
        rev["repo_id"],
        rev["sha"][:12],
        len(manifest["files"]),
        manifest["total_bytes"],
    )
    return manifest


def megatron_checkpoint_step(
    hf_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    record_out: str | os.PathLike,
    *,
    tp: int,
    gpus: int,
    converter: str,
    python: str | None = None,
) -> dict[str, Any]:
    """Convert the Hugging Face weights to a Megatron torch_dist checkpoint (needs the GPU environment)."""
    from ..models.megatron import run_megatron_convert

    rec = run_megatron_convert(
        hf_dir, out_dir, tp=tp, gpus=gpus, converter=converter, python=python or sys.executable
    )
    atomic_write_json(record_out, rec)
    return rec


def _read_trajectories(path: str | os.PathLike) -> list[dict[str, Any]]:
    from ..grading.evidence import read_evidence

    return read_evidence(path)


def warm_start_step(
    model_dir: str | os.PathLike,
    trajectories: str | os.PathLike,
    out_dir: str | os.PathLike,
    summary_out: str | os.PathLike,
    *,
    steps: int,
    lr: float,
    seed: int = 1,
) -> dict[str, Any]:
    """Fine-tune the model on the e2e check's recorded sessions (`sweflow.train.warm_start`)."""
    from ..train.warm_start import warm_start

    summary = warm_start(model_dir, _read_trajectories(trajectories), out_dir, steps=steps, lr=lr, seed=seed)
    atomic_write_json(summary_out, summary)
    log.info(
        "warm start: %d window(s), loss %.4f -> %.6f in %.1fs",
        summary["windows"],
        summary["loss_first"],
        summary["loss_last"],
        summary["seconds"],
    )
    return summary


# ----------------------------------------------------------------------------------------------- GRPO
def read_tasks(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The training rows of a tasks.valid.jsonl; an empty file is an error (nothing to train on)."""
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        raise TrainError("no valid task to train on", file=str(path), hint="every task failed validation")
    return rows


def _prepare_work(run_dir: Path, recipe_json: str) -> Path:
    """The run's working folder; emptied when it holds another recipe's state."""
    work = run_dir / "work"
    marker = work / "recipe.json"
    if marker.exists() and marker.read_text() != recipe_json:
        log.warning("the recipe changed: starting %s over", run_dir)
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    if not marker.exists():
        atomic_write(marker, recipe_json)
    return work


def _publish(work: Path, outputs: Mapping[str, str]) -> None:
    """Copy the work folder's results to the declared outputs (each written beside, then renamed)."""
    atomic_write(
        outputs["metrics"],
        (work / "metrics.jsonl").read_bytes() if (work / "metrics.jsonl").exists() else b"",
    )
    for key, name in (("rollouts", "rollouts"), ("final", "final")):
        dest = Path(outputs[key])
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        if (work / name).exists():
            shutil.copytree(work / name, tmp)
        else:
            tmp.mkdir(parents=True)
        replace_folder(tmp, dest)


def _checkpoints(work: Path) -> list[dict[str, Any]]:
    found = []
    for ckpt in sorted((work / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1])):
        weights = sorted(ckpt.glob("*.safetensors"))
        found.append(
            {
                "path": str(ckpt),
                "step": int(ckpt.name.split("-")[-1]),
                "weights": {w.name: sha256_file(w) for w in weights},
            }
        )
    return found


def train_grpo_step(
    tasks: str | os.PathLike,
    model_dir: str | os.PathLike,
    template_map: str | os.PathLike,
    outputs: Mapping[str, str],
    *,
    train: Mapping[str, Any],
    sandbox: Mapping[str, Any],
    provider: str,
    megatron_dir: str | None = None,
) -> dict[str, Any]:
    """The train_grpo rule's body: GRPO on the valid tasks with the configured engine, then the outputs.

    `outputs`: summary, metrics, rollouts, final (paths of the rule's declared outputs).
    """
    from ..train.recipe import Recipe, check_recipe

    recipe = Recipe.from_config(train)
    check_recipe(recipe)
    if provider == "e2b" and not _proxy_settings(train)["public_url"]:
        raise TrainError(
            "E2B sandboxes reach the proxy over the internet, and train.proxy.public_url is not set",
            field="train.proxy.public_url",
            hint="publish the proxy's port(s) over HTTP(S) and set the URL ({port} is filled in per proxy)",
        )
    rows = read_tasks(tasks)
    run_dir = Path(outputs["summary"]).parent
    work = _prepare_work(run_dir, stable_json(recipe.to_dict()))
    if recipe.engine == "trl":
        result = _run_trl(recipe, rows, model_dir, work, train, sandbox, provider)
    else:
        result = _run_verl(recipe, tasks, rows, model_dir, work, train, sandbox, provider, megatron_dir)
    _publish(work, outputs)
    metrics = [json.loads(x) for x in Path(outputs["metrics"]).read_text().splitlines() if x.strip()]
    summary = {
        **result,
        "run": recipe.run,
        "tasks": len(rows),
        "task_ids": [r["metadata"]["instance_id"] for r in rows],
        "recipe": recipe.to_dict(),
        "template_map_sha256": sha256_file(template_map),
        "metrics_steps": len(metrics),
        "samples": sum(m.get("samples", 0) for m in metrics),
        "aborted": sum(m.get("aborted", 0) for m in metrics),
        "groups_with_gradient": sum(m.get("groups_with_gradient", 0) for m in metrics),
        "reward_mean_by_step": [m.get("reward_mean") for m in metrics],
        "checkpoints": _checkpoints(work),
        "final_weights": {
            p.name: sha256_file(p) for p in sorted(Path(outputs["final"]).glob("*.safetensors"))
        },
    }
    summary.pop("final_checkpoint", None)
    atomic_write_json(outputs["summary"], summary)
    return summary


def _run_trl(recipe, rows, model_dir, work, train, sandbox, provider) -> dict[str, Any]:
    """TRL in this process (world size 1), or in `world size` processes (sweflow.train.launch)."""
    from ..train import launch
    from ..train.worker import trl_in_process

    plan = launch.plan(recipe, python=sys.executable, job_id=os.environ.get("SLURM_JOB_ID") or None)
    if plan.argv is None:
        return trl_in_process(recipe, rows, model_dir, work, train, sandbox, provider)
    log.info("TRL data parallel: %s", plan.describe())
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    result_file = work / "result.json"
    result_file.unlink(missing_ok=True)
    spec = {
        "rows": rows,
        "model_dir": str(model_dir),
        "work": str(work),
        "train": dict(train),
        "sandbox": dict(sandbox),
        "provider": provider,
        "logs": str(logs),
        "result": str(result_file),
    }
    # the spec (live config sections: they may hold secrets) travels in the environment, never on disk
    env = {**os.environ, launch.SPEC_ENV: json.dumps(spec)}
    proc = subprocess.run(plan.argv, env=env, check=False)
    if proc.returncode != 0 or not result_file.exists():
        raise TrainError(
            f"the {plan.world_size} TRL processes exited with status {proc.returncode}",
            file=str(logs),
            hint=f"each rank's log is {logs}/rank-<n>.log; {plan.describe()}",
        )
    return {**read_json(result_file), "processes": plan.world_size,
            "nodes": [n.name for n in plan.nodes] or None}  # fmt: skip


def _run_verl(recipe, tasks, rows, model_dir, work, train, sandbox, provider, megatron_dir) -> dict[str, Any]:
    import pandas as pd

    from ..train import verl_engine as ve

    data = pd.DataFrame(
        [
            {
                "prompt": [
                    {
                        "role": "user",
                        "content": "\n\n".join(m["content"] for m in r["prompt"] if m.get("role") == "user"),
                    }
                ],
                "data_source": "sweflow",
                "agent_name": ve.AGENT_LOOP_NAME,
                "sweflow_row": json.dumps(r, sort_keys=True),
                "extra_info": {"index": i, "instance_id": r["metadata"]["instance_id"]},
            }
            for i, r in enumerate(rows)
        ]
    )
    parquet = work / "train.parquet"
    data.to_parquet(parquet)
    agent_cfg = work / "agent_loop.yaml"
    atomic_write(agent_cfg, ve.agent_loop_config_yaml())
    spec = {
        "provider": provider,
        "sandbox": dict(sandbox),
        "proxy": _proxy_settings(train),
        "rollout": {
            "max_concurrency": recipe.max_concurrency,
            "turn_timeout": recipe.turn_timeout,
            "session_prefix": f"{recipe.run}.",
        },
        "sampling": {
            "max_new_tokens": recipe.max_response_tokens,  # per call
            "max_context_tokens": recipe.max_context_tokens,
            "temperature": recipe.temperature,
            "top_p": recipe.top_p,
            "top_k": recipe.top_k,
        },
    }
    spec_path = work / "rollout-spec.json"
    atomic_write_json(spec_path, spec)
    overrides = ve.verl_overrides(
        recipe,
        train_files=str(parquet),
        val_files=str(parquet),
        model_path=str(model_dir),
        out_dir=str(work),
        agent_loop_config=str(agent_cfg),
        megatron_ckpt=megatron_dir,
    )
    ve.compose_verl_config(overrides)  # a bad override fails here, before Ray starts
    script = ve.launch_script(
        recipe,
        overrides,
        python=sys.executable,
        ray_port=int(recipe.verl.get("ray_port", default("train.verl.ray_port"))),
        log_dir=str(work / "logs"),
        env={"SWEFLOW_ROLLOUT_SPEC": str(spec_path), "SWEFLOW_ROLLOUT_LOG": str(work / "rollout-log")},
    )
    launcher = work / "launch.sh"
    atomic_write(launcher, script)
    proc = subprocess.run(["bash", str(launcher)], check=False)
    if proc.returncode != 0:
        raise TrainError(
            f"verl's trainer exited with status {proc.returncode}",
            file=str(launcher),
            hint=f"see {work / 'logs'}",
        )
    steps = ve.convert_verl_log(
        work / "logs" / "verl_metrics", work / "metrics.jsonl", rollout_dir=work / "rollout-log"
    )
    _verl_rollout_files(work)
    last = ve.latest_checkpoint_step(work / "checkpoints")
    if last is None:
        raise TrainError("verl saved no checkpoint", file=str(work / "checkpoints"), field="train.save_every")
    # the final Hugging Face checkpoint: verl's own merger over the actor's last Megatron checkpoint
    from transformers import AutoConfig

    tie = bool(getattr(AutoConfig.from_pretrained(str(model_dir)), "tie_word_embeddings", False))
    tmp = work / "final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    merge = ve.merge_command(work / "checkpoints", last, tmp, python=sys.executable, tie_word_embeddings=tie)
    proc = subprocess.run(merge, check=False)
    if proc.returncode != 0:
        raise TrainError(
            f"verl's model merger exited with status {proc.returncode}", file=str(work / "checkpoints")
        )
    shutil.rmtree(work / "final", ignore_errors=True)
    os.replace(tmp, work / "final")
    return {"engine": "verl", "steps": steps, "final_from_step": last}


def _verl_rollout_files(work: Path) -> None:
    """The agent loop's per-process rollout log -> rollouts/step-<n>.jsonl."""
    by_step: dict[int, list[str]] = {}
    for f in sorted((work / "rollout-log").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                by_step.setdefault(int(json.loads(line).get("step") or 0), []).append(line)
    out = work / "rollouts"
    out.mkdir(exist_ok=True)
    for step, lines in sorted(by_step.items()):
        atomic_write(out / f"step-{step}.jsonl", "".join(sorted(lines)) + "\n" if lines else "")
