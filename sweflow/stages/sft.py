"""The SFT stage (rules/sft.smk) as plain functions: expert trajectories -> fresh-sandbox grading -> chat
messages -> supervised fine-tuning (SWE-smith's recipe): `collect_trajectories_step` (the real agent, its model
calls passed through the proxy to `sft.collect.expert`; the key is read from the environment by name and never
written), `evaluate_predictions_step` (kept = resolved and integrity-clean), `traj_to_messages_step` (tool-call
chat JSONL and SWE-smith's text form) and `train_sft_step` (TRL's SFTTrainer, sweflow.train.sft).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import secrets
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import DatasetError, TrainError
from ..grading.evidence import read_evidence, write_evidence
from ..rulekit import from_snakemake
from ..sandbox.registry import provider_from_config
from ..sandbox.settings import SandboxSettings
from ..schema import default, defaults
from ..util import atomic_write, atomic_write_json, replace_folder, sha256_bytes
from .common import shard_ids

__all__ = [
    "SFT_COLLECT_CACHE",
    "collect_cache_key",
    "collect_trajectories_step",
    "evaluate_predictions_step",
    "from_snakemake",
    "traj_to_messages_step",
    "train_sft_step",
]

log = logging.getLogger("sweflow.sft")


def _valid_rows(jsonl_files: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    rows = []
    for path in jsonl_files:
        for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                row["metadata"]["instance_id"]
            except (ValueError, KeyError, TypeError) as exc:
                raise DatasetError(
                    f"bad training row: {exc}", file=str(path), row=n, field="metadata"
                ) from None
            rows.append(row)
    return rows


def shard_rows(rows: Sequence[dict[str, Any]], shard: int, shards: int, limit: int | None) -> list[dict]:
    """The rows of one shard (by a stable hash of the instance id) after the first `limit` rows."""
    wanted = set(shard_ids([r["metadata"]["instance_id"] for r in rows], shard, shards, limit))
    picked = list(rows)[:limit] if limit is not None else list(rows)
    return [r for r in picked if r["metadata"]["instance_id"] in wanted]


# ----- the trajectory cache: a task's attempts are bought once while its row and the settings that make a
# trajectory are unchanged. Kept outside results/ (never a declared output, so no rerun and no `--forcerun`
# deletes it); one gzip JSON file per task, written atomically; only tasks whose every attempt completed are
# kept (an aborted attempt is an infrastructure fault: the next run collects that task again).
SFT_COLLECT_CACHE = "resources/cache/sft-collect"
# sft.collect keys that pick tasks or bound a run, not what one task's trajectories are
_NOT_IN_KEY = ("shards", "limit")


def collect_cache_key(
    row: Mapping[str, Any],
    collect: Mapping[str, Any],
    *,
    provider: str,
    sandbox: Mapping[str, Any] | None = None,
    expert_patch: str | None = None,
) -> str:
    """sha256 of what makes one task's expert attempts: the task row (backend options applied), the result
    settings of sft.collect but those that pick tasks (the expert's endpoint and model among them), the
    provider and the sandbox's result settings, and the scripted expert's patch (offline only)."""
    from ..params import canonical, result_values

    settings = {k: v for k, v in result_values(dict(collect), "sft.collect").items() if k not in _NOT_IN_KEY}
    expert = collect.get("expert") or {}
    ident = {
        "row": row,
        "collect": settings,
        "expert": {"endpoint": expert.get("endpoint"), "model": expert.get("model")},
        "provider": provider,
        "sandbox": result_values(dict(sandbox or {}), "sandbox"),
        "expert_patch": expert_patch,
    }
    return sha256_bytes(json.dumps(canonical(ident), sort_keys=True, ensure_ascii=False))


def _cache_file(cache_dir: str | os.PathLike, key: str) -> Path:
    return Path(cache_dir) / f"{key}.json.gz"


def cache_get(cache_dir: str | os.PathLike | None, key: str, attempts: int) -> list[dict[str, Any]] | None:
    """A task's cached attempts, or None (no cache, no entry, or an unreadable one)."""
    if not cache_dir:
        return None
    path = _cache_file(cache_dir, key)
    if not path.exists():
        return None
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            preds = json.load(fh)["predictions"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("trajectory cache entry %s unreadable (%s): collecting again", path.name, exc)
        return None
    return preds if isinstance(preds, list) and len(preds) == attempts else None


def cache_put(cache_dir: str | os.PathLike | None, key: str, preds: Sequence[Mapping[str, Any]]) -> bool:
    """Keep a task's attempts when every one completed; returns whether it was kept."""
    if not cache_dir or not preds or any(p.get("status") != "completed" for p in preds):
        return False
    data = json.dumps({"key": key, "predictions": list(preds)}, ensure_ascii=False, sort_keys=True)
    # mtime 0 in the gzip header: the same attempts give the same bytes
    atomic_write(_cache_file(cache_dir, key), gzip.compress(data.encode("utf-8"), mtime=0))
    return True


def _scripted_patches(parquets: Sequence[tuple[str, str | os.PathLike]], shape: str) -> dict[str, str]:
    """instance_id -> the gold patch the offline expert replays (the split parquets')."""
    from .validate import gold_patches

    patches: dict[str, str] = {}
    for split, parquet in parquets:
        patches.update(gold_patches(parquet, split=split, shape=shape))
    return patches


@contextlib.contextmanager
def expert_upstream(
    expert: Mapping[str, Any], parquets: Sequence[tuple[str, str | os.PathLike]], shape: str = "auto"
) -> Iterator[Any]:
    """The pass-through Upstream for the `sft.collect.expert` section; "scripted" serves the offline expert
    (it replays the gold patches of the given (split, parquet) files) for the duration."""
    from ..proxy.passthrough import upstream_from_settings

    if expert.get("endpoint") != "scripted":
        yield upstream_from_settings(expert)
        return
    from ..offline.expert import DEFAULT_PLAN, base_url, scripted_expert

    patches = _scripted_patches(parquets, shape)
    env_name = expert.get("api_key_env")
    # The offline expert checks a key like the real API does: the configured variable's value when it is
    # set (a test plants one), else a random one made here; either way it only lives in this process.
    key = os.environ.get(env_name or "", "") or secrets.token_urlsafe(24)
    with scripted_expert(patches, expert.get("plan") or DEFAULT_PLAN, api_key=key) as server:
        yield upstream_from_settings(
            {**expert, "endpoint": base_url(server), "api_key_env": "KEY"}, environ={"KEY": key}
        )


def _with_backend(rows: Sequence[dict[str, Any]], overrides: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        row = json.loads(json.dumps(row))
        meta = row["metadata"]
        meta["backend_options"] = {**(meta.get("backend_options") or {}), **dict(overrides or {})}
        out.append(row)
    return out


# `collect_trajectories_step`: k attempts per valid task of one shard with the real agent; its model calls go
# through the proxy's pass-through mode to the `sft.collect.expert` endpoint (the real API for users, the
# scripted expert offline). `traj_to_messages_step`: the kept trajectories (plus published SWE-agent `.traj`
# files, when configured) as tool-call chat JSONL and SWE-smith's text form, and a summary whose counts add up.
def collect_trajectories_step(
    jsonl_files: Sequence[str | os.PathLike],
    parquets: Sequence[tuple[str, str | os.PathLike]],
    out: str | os.PathLike,
    *,
    shard: int,
    collect: Mapping[str, Any],
    provider: str,
    cfg: Mapping[str, Any],
    shape: str = "auto",
    cache_dir: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """One shard's prediction records (gzip JSON lines); returns a count summary. With `cache_dir`, a task
    whose attempts are cached (same row and settings, `collect_cache_key`) is not collected again."""
    from ..proxy import ProxyConfig
    from ..trajectories.collect import collect_trajectories

    settings = SandboxSettings.from_config(cfg)
    proxy = defaults("sft.collect.proxy", collect.get("proxy"))
    if provider == "e2b" and not proxy.get("public_url"):
        raise TrainError(
            "E2B sandboxes reach the proxy over the internet: set sft.collect.proxy.public_url",
            field="sft.collect.proxy.public_url",
        )
    rows = shard_rows(_valid_rows(jsonl_files), shard, int(collect["shards"]), collect.get("limit"))
    rows = _with_backend(rows, collect.get("backend_options") or {})
    attempts = int(collect["attempts"])
    scripted = _scripted_patches(parquets, shape) if collect["expert"].get("endpoint") == "scripted" else {}
    keys = {
        r["metadata"]["instance_id"]: collect_cache_key(
            r, collect, provider=provider, sandbox=cfg,
            expert_patch=scripted.get(r["metadata"]["instance_id"]) if scripted else None,
        )
        for r in rows
    }  # fmt: skip
    cached = {
        iid: hit for iid, key in keys.items() if (hit := cache_get(cache_dir, key, attempts)) is not None
    }
    todo = [r for r in rows if r["metadata"]["instance_id"] not in cached]
    bought: list[dict[str, Any]] = []
    if todo:
        with expert_upstream(collect["expert"], parquets, shape) as upstream:
            bought = collect_trajectories(
                todo,
                provider=provider_from_config(provider, settings),
                upstream=upstream,
                attempts=attempts,
                max_concurrency=int(collect["max_concurrency"]),
                host=str(proxy["host"]),
                port=int(proxy["port"]),
                public_url=proxy["public_url"],
                proxy_config=ProxyConfig(
                    max_new_tokens=int(proxy["max_tokens"]),
                    max_session_requests=proxy["max_requests"],
                    max_session_in_flight=proxy["max_in_flight"],
                ),
            )
            text = json.dumps(bought, ensure_ascii=False)
            if upstream.scrub(text) != text:  # the key must never reach an artifact (nor the cache)
                raise TrainError("a recorded trajectory contains the upstream API key", file=str(out))
    by_task: dict[str, list[dict[str, Any]]] = {}
    for pred in bought:
        by_task.setdefault(pred["instance_id"], []).append(pred)
    for iid, group in by_task.items():
        cache_put(cache_dir, keys[iid], group)
    by_task.update(cached)
    preds = [p for r in rows for p in by_task.get(r["metadata"]["instance_id"], [])]
    write_evidence(out, preds)
    counts = Counter(p["status"] for p in preds)
    log.info("shard %d: %d tasks x %s attempts: %s; %d tasks from the cache, %d collected", shard, len(rows),
             attempts, dict(counts), len(cached), len(todo))  # fmt: skip
    return {"tasks": len(rows), "attempts": len(preds), **counts}


def evaluate_predictions_step(
    predictions: str | os.PathLike,
    jsonl_files: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    evidence_out: str | os.PathLike,
    *,
    provider: str,
    cfg: Mapping[str, Any],
    parallel: int = default("sft.evaluate.parallel"),
) -> dict[str, Any]:
    """Every prediction of one shard graded in a fresh sandbox: evaluation records (JSONL) + evidence."""
    from ..rollout.evaluator import FreshEvaluator
    from ..smith.candidates import write_jsonl
    from ..trajectories.collect import grade_predictions

    settings = SandboxSettings.from_config(cfg)
    rows = {r["metadata"]["instance_id"]: r for r in _valid_rows(jsonl_files)}
    preds = read_evidence(predictions)
    records, evidence = grade_predictions(
        preds,
        rows,
        provider=provider_from_config(provider, settings, purpose="eval"),
        evaluator=FreshEvaluator(network=settings.network),
        parallel=parallel,
    )
    write_evidence(evidence_out, evidence)
    write_jsonl(out, records)
    counts = Counter(r["drop_reason"] or "kept" for r in records)
    log.info("graded %d predictions: %s", len(records), dict(counts))
    return dict(counts)


def _external(extra: Sequence[Mapping[str, Any]]) -> tuple[list[Any], list[dict[str, Any]]]:
    """Published SWE-agent trajectories: (trajectories kept, dropped records). Each entry: `path` (a .traj
    file or a folder of them) and `resolved` (a file of resolved instance ids, one per line or a JSON list;
    null keeps every trajectory with a submission)."""
    from ..trajectories.swe_agent import read_traj

    kept, dropped = [], []
    for entry in extra:
        root = Path(entry["path"])
        files = sorted(root.rglob("*.traj")) if root.is_dir() else [root]
        resolved = None
        if entry.get("resolved"):
            text = Path(entry["resolved"]).read_text(encoding="utf-8")
            ids = json.loads(text) if text.lstrip().startswith("[") else text.split()
            resolved = {str(i) for i in ids}
        for f in files:
            traj = read_traj(f)
            if resolved is not None and traj.instance_id not in resolved:
                dropped.append({"id": traj.id, "source": str(f), "drop_reason": "not_resolved"})
            elif resolved is None and not (traj.patch or "").strip():
                dropped.append({"id": traj.id, "source": str(f), "drop_reason": "no_submission"})
            else:
                kept.append(traj)
    return kept, dropped


def traj_to_messages_step(
    predictions: Sequence[str | os.PathLike],
    evaluations: Sequence[str | os.PathLike],
    tools_out: str | os.PathLike,
    text_out: str | os.PathLike,
    summary_out: str | os.PathLike,
    *,
    extra: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The kept trajectories in both chat forms, and a summary: attempts collected, completed, graded,
    resolved, kept and dropped by reason (the counts add up), the ids trained on and the system prompts."""
    from ..smith.candidates import read_jsonl
    from ..trajectories.claude_transcripts import read_claude_code, tool_call_row
    from ..trajectories.text_form import text_row

    verdicts: dict[str, dict[str, Any]] = {}
    for path in evaluations:
        for rec in read_jsonl(path):
            verdicts[rec["id"]] = rec
    trajectories, dropped, attempts = [], Counter(), 0
    statuses: Counter = Counter()
    for path in predictions:
        for pred in read_evidence(path):
            attempts += 1
            statuses[pred["status"]] += 1
            verdict = verdicts.get(pred["id"])
            if verdict is None:
                raise DatasetError("prediction without an evaluation record", file=str(path), row=pred["id"],
                                   field="id")  # fmt: skip
            if not verdict["kept"]:
                dropped[verdict["drop_reason"]] += 1
                continue
            try:
                trajectories.append(read_claude_code(pred, where=str(path)))
            except DatasetError as exc:  # one refused transcript is reported; the others go on
                log.warning("transcript refused: %s", exc.one_line())
                dropped[f"transcript_refused:{exc.field or 'turns'}"] += 1
    external, external_dropped = _external(extra)
    trajectories.sort(key=lambda t: t.id)
    external.sort(key=lambda t: t.id)
    everything = trajectories + external
    ids = [t.id for t in everything]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DatasetError(f"two trajectories share the id {dup!r}", field="id")
    tool_rows = [tool_call_row(t) for t in everything]
    text_rows = [text_row(t) for t in everything]
    atomic_write(
        tools_out, "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in tool_rows)
    )
    atomic_write(
        text_out, "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in text_rows)
    )
    prompts = {}
    for t in everything:
        prompts.setdefault(sha256_bytes(t.system), t.system)
    graded = sum(1 for v in verdicts.values() if v["status"] == "graded")
    summary = {
        "attempts": attempts,
        "collection": dict(sorted(statuses.items())),
        "graded": graded,
        "resolved": sum(1 for v in verdicts.values() if v.get("resolved")),
        "kept": len(trajectories),
        "dropped": sum(dropped.values()),
        "dropped_by_reason": dict(sorted(dropped.items())),
        "external": {"kept": len(external), "dropped": len(external_dropped), "records": external_dropped},
        "rows": len(everything),
        "trajectory_ids": ids,
        "instances": len({t.instance_id for t in everything}),
        "system_prompts": [{"sha256": k, "text": v} for k, v in sorted(prompts.items())],
        "tools_sha256": sorted({sha256_bytes(json.dumps(t.tools, sort_keys=True)) for t in everything}),
        "tool_calls": sum(len(m.get("tool_calls") or []) for t in everything for m in t.messages),
    }
    if summary["kept"] + summary["dropped"] != attempts:
        raise DatasetError("kept + dropped does not add up to the attempts collected", file=str(summary_out))
    atomic_write_json(summary_out, summary)
    log.info("messages: %d rows (%d collected kept of %d attempts, %d external)", len(everything),
             len(trajectories), attempts, len(external))  # fmt: skip
    return summary


def train_sft_step(
    messages: str | os.PathLike,
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    summary_out: str | os.PathLike,
    metrics_out: str | os.PathLike,
    final_out: str | os.PathLike,
    *,
    train: Mapping[str, Any],
    tracking: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Fine-tune `model_dir` on the messages JSONL; final checkpoint in `final_out`, metrics and summary.
    `tracking`: the `train.tracking` section (TensorBoard files under the run's folder, beside work/).

    One process trains here; more (`parallel.nodes` x `gpus_per_node`) are started with accelerate (FSDP2
    when `parallel.fsdp`), through srun on every node of the Slurm allocation when inside one."""
    import subprocess
    import sys

    from ..train.sft import SFTSettings, train_sft
    from ..train.sft_worker import sft_launch

    rows = [
        json.loads(line) for line in Path(messages).read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    if not rows:
        raise TrainError("no trajectory to fine-tune on (every attempt was dropped)", file=str(messages))
    par = defaults("sft.train.parallel", train.get("parallel"))
    nodes, gpus = int(par["nodes"]), int(par["gpus_per_node"])
    fields = set(SFTSettings.__dataclass_fields__)
    known = {k: v for k, v in dict(train).items() if k in fields}
    known["fsdp"] = "fsdp2" if par["fsdp"] and gpus and nodes * gpus > 1 else None
    settings = SFTSettings.from_mapping(known)
    from ..train.resume import last_complete_checkpoint, prepare_work, sft_fingerprint

    # checkpoints made from other messages, weights, result keys or code are not resumed (one log line
    # says what changed); a checkpoint whose save was cut off is removed before any process starts
    fingerprint = sft_fingerprint(train=train, messages=messages, model_dir=model_dir)
    work = prepare_work(Path(out_dir), fingerprint, "sft.train")
    last_complete_checkpoint(work / "checkpoints", remove_partial=True)
    spec = work / "spec.json"
    launch = sft_launch(settings, spec, nodes=nodes, gpus_per_node=gpus, python=sys.executable,
                        job_id=os.environ.get("SLURM_JOB_ID"))  # fmt: skip
    log.info("SFT launch: %s", launch.describe())
    if launch.argv is None:
        summary = train_sft(rows, model_dir, work, settings, metrics_path=metrics_out, tracking=tracking,
                            tracking_dir=work.parent)  # fmt: skip
    else:
        worker_summary = work / "summary.worker.json"
        worker_summary.unlink(missing_ok=True)
        atomic_write_json(spec, {"rows": str(messages), "model_dir": str(model_dir), "out_dir": str(work),
                                 "settings": known, "metrics_path": str(metrics_out),
                                 "summary_path": str(worker_summary), "logs": str(work / "logs"),
                                 "tracking": tracking, "tracking_dir": str(work.parent)})  # fmt: skip
        proc = subprocess.run(launch.argv, check=False)
        if proc.returncode != 0 or not worker_summary.exists():
            raise TrainError(f"the SFT processes failed (exit {proc.returncode}); see {work / 'logs'}")
        summary = json.loads(worker_summary.read_text(encoding="utf-8"))
    summary["launch"] = {"world_size": launch.world_size, "nodes": [n.name for n in launch.nodes],
                         "rendezvous": launch.rendezvous}  # fmt: skip
    final = Path(final_out)
    if (work / "final").resolve() != final.resolve():
        replace_folder(work / "final", final)
    summary["final"] = str(final_out)
    atomic_write_json(summary_out, summary)
    return summary
