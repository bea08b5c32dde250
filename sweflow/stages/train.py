"""The train stage (rules/train.smk) as plain functions: model preparation (resolve, download, Megatron
checkpoint), the optional warm start, and the GRPO run on the validated tasks of one split.

The run's folder is results/<dataset>/grpo/<run>/: a rerun resumes from its last complete checkpoint while
what makes its result is unchanged, and starts over, saying what changed, when not (see `train_grpo_step`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import TrainError
from ..rulekit import from_snakemake
from ..sandbox.settings import SandboxSettings
from ..schema import default
from ..train.engines import ENGINES, EngineRun
from ..train.preempt import TimeLimitStop
from ..train.proxy_settings import ProxySettings, cloud_reach_problem
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
    from ..util import environ
    from .data import hub_endpoint

    with hub_endpoint(endpoint, models=(repo_id,)) as url, environ(hub_endpoint_env(url)):
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
    attempts: int = default("train.model.download_attempts"),
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
    seed: int = default("train.seed"),
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


def select_instances(
    rows: list[dict[str, Any]], instances: list[str] | None, path: str
) -> list[dict[str, Any]]:
    """The rows of `instances` (train.instances) in the split's order; every id must be a valid task."""
    if instances is None:
        return rows
    have = {r["metadata"]["instance_id"] for r in rows}
    missing = [i for i in instances if i not in have]
    if missing or not instances:
        raise TrainError(
            f"train.instances names {', '.join(missing) or 'no task'}, not among the split's valid tasks",
            file=str(path),
            field="train.instances",
            hint="list instance ids of tasks.valid.jsonl, or null for every task",
        )
    wanted = set(instances)
    return [r for r in rows if r["metadata"]["instance_id"] in wanted]


def guarded_rows(
    rows: list[dict[str, Any]], validation: str | os.PathLike | None, *, named: bool, allow: bool
) -> tuple[list[dict[str, Any]], list[str]]:
    """GRPO's rows without the valid tasks whose gold runs got no FAIL_TO_PASS twin (`validation`: the
    split's validation summary, its `without_f2p_twins`), and their ids: a forger that no-ops only the new
    tests is paid there. `allow` (train.allow_twinless) keeps them; tasks `named` in train.instances that
    are twinless are an error rather than a silent drop."""
    if validation is None or allow:
        return rows, []
    twinless = set(read_json(validation).get("without_f2p_twins") or [])
    out = [r for r in rows if r["metadata"]["instance_id"] not in twinless]
    left = [r["metadata"]["instance_id"] for r in rows if r["metadata"]["instance_id"] in twinless]
    if left and named or rows and not out:
        raise TrainError(
            f"{', '.join(left)}: no FAIL_TO_PASS twin in the gold runs, so a forger that no-ops only the new "
            "tests would be paid; GRPO leaves such tasks out",
            file=str(validation),
            field="train.allow_twinless" if not named else "train.instances",
            hint="train on tasks with twins, or set train.allow_twinless: true to take the risk (docs/trust.md)",
        )
    if left:
        log.warning("GRPO leaves out %d task(s) without FAIL_TO_PASS twins: %s", len(left), left)
    return out, left


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


def _record_attempt(work: Path, record: dict[str, Any]) -> None:
    """One line of work/attempts.jsonl per attempt that ended on its own: stopped before the time limit
    (and at which update), or finished (from which update). The Slurm job id says which job it was."""
    line = json.dumps({"job": os.environ.get("SLURM_JOB_ID") or None, **record}, sort_keys=True) + "\n"
    with open(work / "attempts.jsonl", "a", encoding="utf-8") as fh:
        fh.write(line)


def _start_attempt(work: Path, engine: str, attempt: int) -> None:
    """Record this attempt's start in work/attempts.jsonl; a retry that would repeat attempts which made no
    progress fails at once instead (sweflow.train.preempt.no_progress)."""
    from ..train.preempt import no_progress

    if engine == "verl":
        from ..train.verl_engine import latest_checkpoint_step

        from_step = latest_checkpoint_step(work / "checkpoints") or 0
    else:
        from ..train.resume import last_complete_checkpoint

        found = last_complete_checkpoint(work / "checkpoints")
        from_step = int(found.name.rsplit("-", 1)[-1]) if found else 0
    path = work / "attempts.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    why = no_progress(records, attempt=attempt, from_step=from_step)
    if why:
        raise TrainError(f"not retrying: {why}", file=str(path),
                         hint="see the training log; after a fix, rerun the same command (it resumes)")  # fmt: skip
    _record_attempt(work, {"attempt": attempt, "started_from": from_step})


# The run's folder is results/<dataset>/grpo/<run>/. Its declared outputs (summary.json, metrics.jsonl,
# rollouts/, final/) are published at the end; the working state (work/: checkpoints/, the live metrics.jsonl
# and rollouts/) is not an output, so an interrupted run that Snakemake reruns resumes from its last complete
# checkpoint. Changed starting weights, task rows, result keys or training code (work/recipe.json, see
# sweflow.train.resume) start it over; an operational knob does not.
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
    attempt: int = 1,
    validation: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """The train_grpo rule's body: GRPO on the valid tasks with the configured engine, then the outputs.

    `outputs`: summary, metrics, rollouts, final (paths of the rule's declared outputs); `attempt`:
    Snakemake's attempt number (a retry after attempts without progress fails at once); `validation`: the
    split's validation summary (tasks without FAIL_TO_PASS twins are left out, see `guarded_rows`).
    """
    from ..train.recipe import Recipe, check_recipe
    from ..train.resume import prepare_work, run_fingerprint

    recipe = Recipe.from_config(train)
    check_recipe(recipe)
    proxy, settings = ProxySettings.from_config(train), SandboxSettings.from_config(sandbox)
    problem = cloud_reach_problem(
        provider, port=proxy.port, public_url=proxy.public_url, engine=recipe.engine, where="train.proxy"
    )
    if problem:
        raise TrainError(problem[0], field=problem[1], hint=problem[2])
    rows = select_instances(read_tasks(tasks), train.get("instances"), str(tasks))
    rows, twinless = guarded_rows(
        rows, validation, named=train.get("instances") is not None, allow=bool(train.get("allow_twinless"))
    )
    run_dir = Path(outputs["summary"]).parent
    fingerprint = run_fingerprint(
        train=train, sandbox=sandbox, provider=provider, rows=rows, model_dir=model_dir
    )
    work = prepare_work(run_dir / "work", fingerprint)
    _start_attempt(work, recipe.engine, attempt)
    try:
        result = ENGINES[recipe.engine](
            EngineRun(recipe, tasks, rows, model_dir, work, train, proxy, settings, provider, megatron_dir)
        )
    except TimeLimitStop as exc:
        _record_attempt(work, {"stopped_at": exc.step, "why": exc.problem})
        raise
    _record_attempt(work, {"finished": result.get("steps"), "resumed_from": result.get("resumed_from_step")})
    _publish(work, outputs)
    metrics = [json.loads(x) for x in Path(outputs["metrics"]).read_text().splitlines() if x.strip()]
    summary = {
        **result,
        "run": recipe.run,
        "tasks": len(rows),
        "task_ids": [r["metadata"]["instance_id"] for r in rows],
        "left_out_twinless": twinless,
        "recipe": recipe.to_dict(),
        "template_map_sha256": sha256_file(template_map),
        "starting_weights_sha256": fingerprint["weights"],
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
