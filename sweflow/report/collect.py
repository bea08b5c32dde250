"""What the report shows, read from the pipeline's own artifacts (nothing is recomputed or re-run).

`find_artifacts(root, dataset=..., splits=...)` lists the artifacts the report reads under a workflow
folder (the `report` rule passes its inputs instead, so it runs last); `collect(artifacts, root)` reads
them into plain data, one entry per report section.
"""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import SweflowError


class ReportError(SweflowError):
    """An artifact the report reads is malformed."""


# artifact kind -> glob under the workflow folder ({ds}: dataset, {split}: split)
PATTERNS = {
    "revision": ["resources/datasets/{ds}/revision.json"],
    "rows": ["results/{ds}/{split}/rows.report.json"],
    "images": ["results/{ds}/images.txt"],
    "template_map": ["results/{ds}/template-map.json"],
    "template_failures": ["results/{ds}/template-failures.json"],
    "convert": ["results/{ds}/{split}.convert.json"],
    "jsonl": ["results/{ds}/{split}.jsonl"],
    "smoke": ["results/{ds}/smoke-*.json"],
    "validation": ["results/{ds}/{split}/validation-summary.json"],
    "e2e": ["results/{ds}/e2e/*.json"],
    "grpo": ["results/{ds}/grpo/*/summary.json"],
    "sft_messages": ["results/{ds}/sft/messages/summary.json"],
    "sft_train": ["results/{ds}/sft/train/*/summary.json"],
    "sft_evaluations": ["results/{ds}/sft/evaluations/*/*.jsonl"],
    "smith": ["results/smith/*/summary.json"],
    "evaluation": ["results/{ds}/eval/*/*/summary.json"],
    "outside_predictions": ["results/{ds}/eval/*/predictions-*/report.json"],
}


def find_artifacts(root: str | os.PathLike, *, dataset: str, splits: Iterable[str]) -> dict[str, list[str]]:
    """The report's artifacts that exist under `root`, by kind (paths relative to root, sorted)."""
    root = Path(root)
    found: dict[str, list[str]] = {}
    for kind, patterns in PATTERNS.items():
        paths: set[str] = set()
        for pat in patterns:
            for split in splits if "{split}" in pat else [None]:
                glob = pat.format(ds=dataset, split=split)
                paths.update(str(p.relative_to(root)) for p in root.glob(glob) if p.is_file())
        if kind == "e2e":
            paths = {p for p in paths if p.count(".") == 1}  # the reports, not .evidence / .trajectories
        found[kind] = sorted(paths)
    return found


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"cannot read {path}: {exc}") from None


def _jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ReportError(f"{path}: line {n}: not JSON ({exc.msg})") from None
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc}") from None
    return rows


def _repo_of(instance_id: str) -> str:
    """owner/name from a SWE-bench style id (owner__name-123); the id itself when it has no such shape."""
    if "__" not in instance_id:
        return instance_id
    owner, rest = instance_id.split("__", 1)
    return f"{owner}/{rest.rsplit('-', 1)[0]}"


def data_section(paths: Mapping[str, list[str]], root: Path) -> dict[str, Any]:
    splits: dict[str, dict[str, Any]] = {}
    for p in paths.get("rows", []):
        rep = _json(root / p)
        splits.setdefault(rep["split"], {}).update(rows=rep.get("rows", 0), repos=rep.get("repos", {}))
    for p in paths.get("convert", []):
        rep = _json(root / p)
        s = splits.setdefault(rep["split"], {})
        s["converted"] = rep.get("rows", 0)
        s["skipped"] = [
            {k: item.get(k) for k in ("row", "instance_id", "field", "reason")}
            for item in rep.get("skipped", [])
        ]
    images = None
    for p in paths.get("images", []):
        images = sum(1 for line in (root / p).read_text(encoding="utf-8").splitlines() if line.strip())
    templates = failures = None
    for p in paths.get("template_map", []):
        templates = len(_json(root / p))
    for p in paths.get("template_failures", []):
        failures = _json(root / p)
    smoke = {}
    for p in paths.get("smoke", []):
        rep = _json(root / p)
        smoke[Path(p).stem.removeprefix("smoke-")] = {"ok": rep.get("ok", 0), "failed": rep.get("failed", [])}
    return {"splits": splits, "images": images, "templates": templates, "failures": failures, "smoke": smoke}


def validation_section(paths: Mapping[str, list[str]], root: Path) -> dict[str, Any]:
    repo_by_id: dict[str, str] = {}
    for p in paths.get("jsonl", []):
        for row in _jsonl(root / p):
            meta = row.get("metadata") or {}
            if meta.get("instance_id"):
                repo_by_id[meta["instance_id"]] = meta.get("repo") or _repo_of(meta["instance_id"])
    splits = {}
    for p in paths.get("validation", []):
        rep = _json(root / p)
        by_reason: Counter[str] = Counter()
        by_repo: dict[str, Counter[str]] = defaultdict(Counter)
        for b in rep.get("broken", []):
            reason = f"{b.get('verdict')}: {b.get('reason')}" if b.get("reason") else str(b.get("verdict"))
            by_reason[reason] += 1
            by_repo[repo_by_id.get(b["instance_id"], _repo_of(b["instance_id"]))][str(b.get("verdict"))] += 1
        splits[rep["split"]] = {
            "tasks": rep.get("tasks", 0),
            "valid": rep.get("valid", 0),
            "verdicts": rep.get("verdicts", {}),
            "broken_by_reason": dict(by_reason.most_common()),
            "broken_by_repo": {r: dict(c) for r, c in sorted(by_repo.items())},
            "errors": len(rep.get("errors", [])),
            # gold passed but no canary guarded its runs: out of training unless validation.allow_unguarded
            "unguarded": [[u["instance_id"], u.get("reason")] for u in rep.get("unguarded", [])],
            "unguarded_kept": bool(rep.get("unguarded_kept")),
            # valid, but no FAIL_TO_PASS twin: a forger that no-ops only new tests without a near-copy is paid
            "without_f2p_twins": list(rep.get("without_f2p_twins") or []),
        }
    return {"splits": splits}


STEP_KEYS = (
    "reward_mean",
    "policy_loss",
    "grad_norm",
    "entropy",
    "response_tokens",
    "tis_weight_mean",
    "resolved_share",
    "zero_variance_group_share",
    "kl",
    "clip_fraction",
    "tis_clipped_share",
    "rollout_s",
    "train_s",
    "weight_sync_s",
    "samples",
    "completed",
    "aborted",
    "tampered",
)


def training_section(paths: Mapping[str, list[str]], root: Path) -> dict[str, Any]:
    runs = {}
    for p in paths.get("grpo", []):
        run_dir = (root / p).parent
        summary = _json(root / p)
        metrics = _jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
        metrics.sort(key=lambda m: m.get("step", 0))
        aborted: Counter[str] = Counter()
        for m in metrics:
            aborted.update(m.get("aborted_by_reason") or {})
        # the steps with tamper verdicts, by code (a code no step saw is left out)
        codes = sorted({c for m in metrics for c, n in (m.get("tampered_by_reason") or {}).items() if n})
        tampered = [
            [m.get("step"), m["tampered"], *[(m.get("tampered_by_reason") or {}).get(c, 0) for c in codes]]
            for m in metrics
            if m.get("tampered")
        ]
        runs[run_dir.name] = {
            "engine": summary.get("engine"),
            "steps": [m.get("step") for m in metrics],
            "series": {k: [m.get(k) for m in metrics] for k in STEP_KEYS},
            "aborted_by_reason": dict(aborted.most_common()),
            "tampered": {"codes": codes, "steps": tampered},
            "summary": {
                k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None
            },
        }
    e2e = []
    for p in paths.get("e2e", []):
        rep = _json(root / p)
        for name, pol in sorted((rep.get("policies") or {}).items()):
            e2e.append({"instance": rep.get("instance_id"), "policy": name, "ok": pol.get("ok"),
                        "status": pol.get("status"), "reward": pol.get("reward"),
                        "failure reason": pol.get("failure_reason") or pol.get("evaluation_failure_reason"),
                        "expected": pol.get("expected")})  # fmt: skip
    return {"runs": runs, "e2e": e2e}


def smith_section(paths: Mapping[str, list[str]], root: Path) -> dict[str, Any]:
    profiles = {}
    for p in paths.get("smith", []):
        summary = _json(root / p)
        tasks_file = (root / p).parent / "tasks.jsonl"
        f2p, p2p = [], []
        if tasks_file.exists():
            for row in _jsonl(tasks_file):
                f2p.append(len(row.get("FAIL_TO_PASS") or []))
                p2p.append(len(row.get("PASS_TO_PASS") or []))
        profiles[(root / p).parent.name] = {
            "repo": summary.get("repo"),
            "candidates": summary.get("candidates", 0),
            "tasks": summary.get("tasks", 0),
            "strategies": summary.get("strategies", {}),
            "errors": len(summary.get("errors") or []),
            "f2p": f2p,
            "p2p": p2p,
        }
    return {"profiles": profiles}


def sft_section(paths: Mapping[str, list[str]], root: Path) -> dict[str, Any]:
    evals: Counter[str] = Counter()
    for p in paths.get("sft_evaluations", []):
        for row in _jsonl(root / p):
            reason = row.get("drop_reason") or row.get("status")
            evals["kept" if row.get("kept") else f"dropped: {reason}"] += 1
    messages = _json(root / paths["sft_messages"][0]) if paths.get("sft_messages") else None
    runs = {}
    for p in paths.get("sft_train", []):
        run_dir = (root / p).parent
        metrics = _jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
        runs[run_dir.name] = {
            "steps": [m.get("step") for m in metrics],
            "loss": [m.get("loss") for m in metrics],
            "summary": {k: v for k, v in _json(root / p).items() if isinstance(v, (int, float, str, bool))},
        }
    return {
        "evaluations": dict(evals.most_common()),
        "messages": {k: v for k, v in (messages or {}).items() if isinstance(v, (int, float, str))},
        "runs": runs,
    }


CHECKPOINT_ORDER = ("base", "warm_start", "grpo", "sft")


def evaluation_section(paths: Mapping[str, list[str]], root: Path) -> dict[str, Any]:
    """Per held-out split: each checkpoint's figures (in training order) and the per-task outcome grid
    (resolved attempts of attempts, from attempts.jsonl); graded outside predictions files."""
    splits: dict[str, dict[str, Any]] = {}
    for p in paths.get("evaluation", []):
        path = root / p
        split, name = path.parent.parent.name, path.parent.name
        s = _json(path)
        grid: dict[str, list[int]] = {}
        for a in _jsonl(path.parent / "attempts.jsonl") if (path.parent / "attempts.jsonl").exists() else []:
            if a.get("status") == "completed":
                cell = grid.setdefault(a["instance_id"], [0, 0])
                cell[0] += bool(a.get("resolved"))
                cell[1] += 1
        splits.setdefault(split, {"checkpoints": {}, "outside": {}})["checkpoints"][name] = {
            "figures": {k: s.get(k) for k in ("pass@1", "pass@1_interval", "k", f"pass@{s.get('k')}", "tasks",
                                               "attempts", "lost_attempts", "turns_mean", "tokens_mean", "seed")},
            "failure_reasons": s.get("failure_reasons") or {},
            "grid": grid,
        }  # fmt: skip
    for p in paths.get("outside_predictions", []):
        path = root / p
        r = _json(path)
        split = path.parent.parent.name
        splits.setdefault(split, {"checkpoints": {}, "outside": {}})["outside"][path.parent.name[12:]] = {
            k: r.get(k) for k in ("total_instances", "resolved_instances", "unresolved_instances",
                                  "empty_patch_instances", "error_instances")
        }  # fmt: skip
    for v in splits.values():
        order = {c: i for i, c in enumerate(CHECKPOINT_ORDER)}
        v["checkpoints"] = dict(sorted(v["checkpoints"].items(), key=lambda kv: order.get(kv[0], 99)))
    return {"splits": splits}


def provenance_section(paths: Mapping[str, list[str]], root: Path) -> dict[str, Any]:
    from .. import __version__
    from ..provenance import load_record, record_path

    revision = _json(root / paths["revision"][0]) if paths.get("revision") else {}
    by_rule: Counter[str] = Counter()
    shas: set[str] = set()
    code: set[str] = set()
    missing = 0
    for _kind, items in sorted(paths.items()):
        for p in items:
            if not record_path(root / p, root).is_file():
                missing += 1
                continue
            rec = load_record(root / p, root)
            by_rule[str(rec.get("rule"))] += 1
            for ds in rec.get("datasets", []) or ([rec["dataset"]] if rec.get("dataset") else []):
                if isinstance(ds, Mapping) and ds.get("sha"):
                    shas.add(f"{ds.get('repo_id')}@{ds['sha']}")
            sw = rec.get("code") or {}
            git = sw.get("git") or {}
            commit = git.get("commit") or "no git"
            code.add(
                f"{commit}{' (dirty)' if git.get('dirty') else ''}, tree {sw.get('sweflow_tree_sha256')}"
            )
    return {
        "dataset": {k: revision.get(k) for k in ("repo_id", "revision", "sha") if k in revision},
        "sweflow_version": __version__,
        "records_by_rule": dict(sorted(by_rule.items())),
        "records": sum(by_rule.values()),
        "unrecorded": missing,
        "dataset_shas": sorted(shas),
        "code_trees": sorted(code),
    }


# A missing artifact leaves its section out; a malformed one raises ReportError naming the file.
def collect(paths: Mapping[str, list[str]], root: str | os.PathLike = ".") -> dict[str, Any]:
    """Every section's data from the artifacts in `paths` (by kind, as find_artifacts returns)."""
    root = Path(root)
    return {name: reader(paths, root) for name, reader in SECTION_READERS}


SECTION_READERS = (
    ("data", data_section),
    ("validation", validation_section),
    ("training", training_section),
    ("smith", smith_section),
    ("sft", sft_section),
    ("evaluation", evaluation_section),
    ("provenance", provenance_section),
)
