"""The training engines, one registered function each, picked by `train.engine` (`ENGINES[name](run)`).

`trl` (TRL, in the rule's process or one process per rank) and `verl` (verl's synchronous trainer through a
generated launch script); see above `run_trl` and `run_verl`. Each returns the engine's part of the run
summary; the stage publishes the run folder.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TrainError
from ..sandbox.settings import SandboxSettings
from ..schema import default
from ..util import atomic_write, atomic_write_json, read_json
from .preempt import STOPPED, TimeLimitStop
from .proxy_settings import ProxySettings
from .recipe import Recipe
from .tracking import Tracking, run_info, write_tracking

log = logging.getLogger("sweflow.train")


@dataclass(frozen=True)
class EngineRun:
    """What an engine trains: the recipe, the task rows (and their file), the model, the work folder, the
    `train` section (a TRL rank rebuilds the recipe from it) and the settings its rollouts need."""

    recipe: Recipe
    tasks: str | os.PathLike
    rows: list[dict[str, Any]]
    model_dir: str | os.PathLike
    work: Path
    train: Mapping[str, Any]
    proxy: ProxySettings
    sandbox: SandboxSettings
    provider: str
    megatron_dir: str | None = None


ENGINES: dict[str, Callable[[EngineRun], dict[str, Any]]] = {}


def engine(
    name: str,
) -> Callable[[Callable[[EngineRun], dict[str, Any]]], Callable[[EngineRun], dict[str, Any]]]:
    def register(fn: Callable[[EngineRun], dict[str, Any]]) -> Callable[[EngineRun], dict[str, Any]]:
        ENGINES[name] = fn
        return fn

    return register


# `trl`: TRL in the rule's process, or one process per rank through sweflow.train.launch (data parallel over
# the job's nodes).
@engine("trl")
def run_trl(r: EngineRun) -> dict[str, Any]:
    recipe, rows, model_dir, work, train, proxy, sandbox, provider = (
        r.recipe,
        r.rows,
        r.model_dir,
        r.work,
        r.train,
        r.proxy,
        r.sandbox,
        r.provider,
    )
    """TRL in this process (world size 1), or in `world size` processes (sweflow.train.launch)."""
    from . import launch
    from .resume import last_complete_checkpoint
    from .worker import trl_in_process

    # a save cut off by a kill is removed here, by one process, before any rank looks for its checkpoint
    last_complete_checkpoint(work / "checkpoints", remove_partial=True)
    plan = launch.plan(recipe, python=sys.executable, job_id=os.environ.get("SLURM_JOB_ID") or None)
    tracking = Tracking.from_config(train).checked()
    attach = run_info(recipe, r.tasks)
    if plan.argv is None:
        return trl_in_process(recipe, rows, model_dir, work, proxy, sandbox, provider, tracking=tracking,
                              tracking_dir=work.parent, attach=attach)  # fmt: skip
    log.info("TRL data parallel: %s", plan.describe())
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    result_file = work / "result.json"
    result_file.unlink(missing_ok=True)
    (work / STOPPED).unlink(missing_ok=True)
    spec = {
        "rows": rows,
        "model_dir": str(model_dir),
        "work": str(work),
        "train": dict(train),
        "proxy": proxy.to_spec(),
        "sandbox": sandbox.to_spec(),
        "provider": provider,
        "logs": str(logs),
        "result": str(result_file),
        "tracking_dir": str(work.parent),
        "attach": attach,
    }
    # the spec (the live `train` section and the settings: they may hold secrets) travels in the environment,
    # never on disk
    env = {**os.environ, launch.SPEC_ENV: json.dumps(spec)}
    proc = subprocess.run(plan.argv, env=env, check=False)
    if proc.returncode != 0 and (work / STOPPED).exists():  # torchrun's own status is 1 whatever the rank's
        raise TimeLimitStop(
            f"the {plan.world_size} TRL processes saved a checkpoint and stopped: "
            f"{read_json(work / STOPPED).get('why')}",
            step=read_json(work / STOPPED).get("step"),
            file=str(logs),
            hint="a retry of the job (or a rerun) resumes from that checkpoint",
        )
    if proc.returncode != 0 or not result_file.exists():
        raise TrainError(
            f"the {plan.world_size} TRL processes exited with status {proc.returncode}",
            file=str(logs),
            hint=f"each rank's log is {logs}/rank-<n>.log; {plan.describe()}",
        )
    return {**read_json(result_file), "processes": plan.world_size,
            "nodes": [n.name for n in plan.nodes] or None}  # fmt: skip


def verl_rollout_spec(
    recipe: Recipe, *, provider: str, sandbox: SandboxSettings, proxy: ProxySettings
) -> dict[str, Any]:
    """The rollout spec verl's agent loop builds its dispatcher from (`verl_agent_loop.build_runtime`):
    the provider, the sandbox and proxy settings, the dispatcher's settings and the sampling."""
    return {
        "provider": provider,
        # JSON-equal to the validated sections: the spec's bytes do not change
        "sandbox": sandbox.to_spec(),
        "proxy": proxy.to_spec(),
        "rollout": {
            "max_concurrency": recipe.max_concurrency,
            "turn_timeout": recipe.turn_timeout,
            "session_prefix": f"{recipe.run}.",
            "tampered_reward": recipe.tampered_reward,
        },
        "sampling": {
            "max_new_tokens": recipe.max_response_tokens,  # per call
            "max_context_tokens": recipe.max_context_tokens,
            "temperature": recipe.temperature,
            "top_p": recipe.top_p,
            "top_k": recipe.top_k,
        },
    }


# `verl`: verl's synchronous trainer (Megatron + vLLM on Ray) through a generated launch script, then verl's
# merger for the final Hugging Face checkpoint.
@engine("verl")
def run_verl(r: EngineRun) -> dict[str, Any]:
    recipe, rows, model_dir, work, proxy, sandbox, provider = (
        r.recipe,
        r.rows,
        r.model_dir,
        r.work,
        r.proxy,
        r.sandbox,
        r.provider,
    )
    megatron_dir = r.megatron_dir
    tracking = Tracking.from_config(r.train).checked()
    import pandas as pd

    from . import verl_engine as ve
    from . import verl_metrics

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
    spec = verl_rollout_spec(recipe, provider=provider, sandbox=sandbox, proxy=proxy)
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
        tracking=tracking,
    )
    ve.compose_verl_config(overrides)  # a bad override fails here, before Ray starts
    done = ve.latest_checkpoint_step(work / "checkpoints")
    if done is None:  # a run started over: its old curves go
        shutil.rmtree(work.parent / "tensorboard", ignore_errors=True)
    script = ve.launch_script(
        recipe,
        overrides,
        python=sys.executable,
        ray_port=int(recipe.verl.get("ray_port", default("train.verl.ray_port"))),
        log_dir=str(work / "logs"),
        env={
            "SWEFLOW_ROLLOUT_SPEC": str(spec_path),
            "SWEFLOW_ROLLOUT_LOG": str(work / "rollout-log"),
            **tracking.env(work.parent, "verl"),
        },
    )
    launcher = work / "launch.sh"
    atomic_write(launcher, script)
    # verl resumes from the step its tracker file names, written after a save completed (resume_mode auto)
    log.info("verl %s", f"resumes from global_step_{done}" if done else "starts at step 0")
    (work / STOPPED).unlink(missing_ok=True)
    proc = subprocess.run(["bash", str(launcher)], check=False)
    if (work / STOPPED).exists():  # sweflow.train.verl_deadline: saved before Slurm's time limit and stopped
        stop = read_json(work / STOPPED)
        raise TimeLimitStop(
            f"verl saved a checkpoint at step {stop.get('step')} and stopped: {stop.get('why')}",
            step=stop.get("step"),
            file=str(work / "logs"),
            hint="a retry of the job (or a rerun) resumes from that checkpoint",
        )
    if proc.returncode != 0:
        raise TrainError(
            f"verl's trainer exited with status {proc.returncode}",
            file=str(launcher),
            hint=f"see {work / 'logs'}",
        )
    steps = verl_metrics.convert_verl_log(
        work / "logs" / "verl_metrics", work / "metrics.jsonl", rollout_dir=work / "rollout-log"
    )
    _verl_rollout_files(work)
    write_tracking(work / "metrics.jsonl", work.parent, tracking, run_name=recipe.run,
                   attach=run_info(recipe, r.tasks))  # fmt: skip
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
