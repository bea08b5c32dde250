"""The SWE-smith stage (rules/smith.smk) as plain functions: environment + reference run, candidates per
strategy and shard, validation per shard, gather, problem statements, and the dataset parquet."""

from __future__ import annotations

import contextlib
import logging
import os
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..errors import SmithError
from ..progress import item_log
from ..rulekit import from_snakemake
from ..sandbox.registry import provider_from_config
from ..sandbox.settings import SandboxSettings
from ..schema import default
from ..smith.candidates import FIRST_STRATEGIES, Candidate, read_candidates, read_jsonl, shard_of, write_jsonl
from ..smith.profile import RepoProfile, load_profile
from ..smith.strategies import Shard, candidates_of, request_failed
from ..util import atomic_write_json, read_json
from .common import profile_entries, smith_harness

__all__ = [
    "FIRST_STRATEGIES",
    "profile_entries",
    "smith_harness",
    "bug_candidates_step",
    "from_snakemake",
    "gather_step",
    "lm_endpoint",
    "load_profile",
    "repo_env_step",
    "smith_dataset_step",
    "statements_step",
    "validate_candidates_step",
]

log = logging.getLogger("sweflow.smith")


def _harness_parser(profile: RepoProfile, package: str):
    from ..harness import load_harness

    return load_harness(package).find_parser(profile.log_parser)


# ----- repo_env --------------------------------------------------------------------------------------------
def repo_env_step(
    profile: RepoProfile,
    bare_out: str | os.PathLike,
    env_out: str | os.PathLike,
    *,
    provider: str,
    sandbox_cfg: Mapping[str, Any],
    runs: int,
    harness_package: str,
    wheel_record: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """The repository as a bare repository at its resolved commit, its environment template, and the
    reference run (the whole suite `runs` times). A reference that fails, times out or has no test is
    reported (`ok: false`), and every later step skips the repository; an infrastructure fault raises."""
    from ..smith.bug_validation import reference_run, reference_verdict
    from ..smith.env import build_environment, materialize_source

    settings = SandboxSettings.from_config(sandbox_cfg)
    src = materialize_source(profile, bare_out)
    data: dict[str, Any] = {"profile": profile.to_dict(), **src, "provider": provider}
    wheel = None
    if wheel_record:
        rec = read_json(wheel_record)
        wheel = Path(wheel_record).parent / rec["path"]
    # A fault while building or running (no engine, a dead sandbox after retries) fails the job (Snakemake
    # retries and reports it): it says nothing about the repository. Only the reference's own outcome
    # (no tests found, too few pass, a timeout) marks the repository unusable.
    prov = provider_from_config(provider, settings, purpose="build")
    tpl = build_environment(prov, provider, profile, bare_out, src["commit"], settings=settings, wheel=wheel)
    data["template"] = tpl
    res = reference_run(
        provider_from_config(provider, settings, purpose="eval"),
        tpl["template"],
        profile,
        src["commit"],
        parser=_harness_parser(profile, harness_package),
        runs=runs,
    )
    data["reference"] = reference_verdict(res, profile)
    data["reference"]["runs"] = [
        {"exit_code": r.exit_code, "seconds": r.seconds, "tests": len(r.statuses)} for r in res.runs
    ]
    data["ok"] = bool(data["reference"]["ok"])
    atomic_write_json(env_out, data)
    ref = data["reference"]
    if data["ok"]:
        log.info(
            "%s@%s: %d of %d tests pass (stable)",
            profile.repo,
            src["commit"][:8],
            len(ref["passed"]),
            ref["tests"],
        )
    else:
        log.error("%s: reference run not usable, repository skipped: %s", profile.repo, ref["reason"])
    return data


# ----- LM endpoint -----------------------------------------------------------------------------------------
@contextlib.contextmanager
def lm_endpoint(cfg: Mapping[str, Any]) -> Iterator[Any]:
    """LMSettings for the `smith.lm` section; "scripted" starts the bundled offline endpoint meanwhile."""
    from ..smith.lm import lm_settings

    cfg = dict(cfg)
    if cfg.get("endpoint") != "scripted":
        yield lm_settings(cfg)
        return
    from ..offline.scripted_lm import ScriptedLM, offline_responder

    with ScriptedLM(offline_responder) as server:
        yield lm_settings({**cfg, "endpoint": server.url})


def _lm_record(settings: Any, cfg: Mapping[str, Any]) -> dict[str, Any]:
    rec = settings.record()
    if cfg.get("endpoint") == "scripted":
        rec["endpoint"] = "scripted"  # not the port the offline endpoint happened to get
    return rec


# ----- bug_candidates --------------------------------------------------------------------------------------
def bug_candidates_step(
    strategy: str,
    shard: int,
    env_file: str | os.PathLike,
    bare: str | os.PathLike,
    out: str | os.PathLike,
    report_out: str | os.PathLike,
    *,
    smith: Mapping[str, Any],
    validated: Sequence[str] = (),
    validated_candidates: Sequence[str] = (),
) -> dict[str, Any]:
    """One shard of one strategy's candidates (JSONL) and its report (count, skipped items with reasons)."""
    import tempfile

    from ..smith.gitrepo import checkout, source_files

    env = read_json(env_file)
    opts = dict(smith["strategies"][strategy])
    shards = int(opts.get("shards", default(f"smith.strategies.{strategy}.shards")))
    seed = int(smith["seed"])
    cands: list[Candidate] = []
    skipped: list[dict[str, Any]] = []
    lm_record = None
    if env.get("ok"):
        repo, commit = env["profile"]["repo"], env["commit"]
        with tempfile.TemporaryDirectory(prefix="sweflow-smith-") as tmp:
            tree = checkout(bare, commit, Path(tmp) / "tree")
            files = source_files(tree)
            lm_used: list[dict[str, Any]] = []

            @contextlib.contextmanager
            def open_lm() -> Iterator[Any]:
                with lm_endpoint(smith["lm"]) as settings:
                    lm_used.append(_lm_record(settings, smith["lm"]))
                    yield settings

            cands, skipped = candidates_of(
                Shard(
                    strategy=strategy,
                    tree=tree,
                    files=files,
                    repo=repo,
                    commit=commit,
                    seed=seed,
                    shard=shard,
                    shards=shards,
                    opts=opts,
                    open_lm=open_lm,
                    kept=lambda: _kept_candidates(validated, validated_candidates),
                )
            )
            lm_record = lm_used[-1] if lm_used else None
    write_jsonl(out, (c.to_dict() for c in cands))
    report = {
        "strategy": strategy,
        "shard": shard,
        "shards": shards,
        "candidates": len(cands),
        "skipped": skipped,
        "lm": lm_record,
        "repository_ok": bool(env.get("ok")),
    }
    atomic_write_json(report_out, report)
    log.info("%s shard %d/%d: %d candidates, %d skipped", strategy, shard, shards, len(cands), len(skipped))
    return report


def _kept_candidates(reports: Sequence[str], candidate_files: Sequence[str]) -> list[dict[str, Any]]:
    kept = {r["instance_id"] for f in reports for r in read_jsonl(f) if r.get("status") == "kept"}
    return [c.to_dict() for f in candidate_files for c in read_candidates(f) if c.instance_id in kept]


# ----- validate_candidates ---------------------------------------------------------------------------------
def validate_candidates_step(
    candidates_file: str | os.PathLike,
    env_file: str | os.PathLike,
    out: str | os.PathLike,
    *,
    provider: str,
    sandbox_cfg: Mapping[str, Any],
    validation: Mapping[str, Any],
    harness_package: str,
    require_p2p: bool = True,
    parallel: int = 1,
) -> dict[str, int]:
    """A report line per candidate of one shard (same order), validated `parallel` at a time."""
    from ..smith.bug_validation import validate_candidate

    env = read_json(env_file)
    cands = read_candidates(candidates_file)
    reports: list[dict[str, Any]] = []
    if env.get("ok") and cands:
        profile = load_profile(env["profile"])
        prov = provider_from_config(provider, SandboxSettings.from_config(sandbox_cfg), purpose="eval")
        parser = _harness_parser(profile, harness_package)
        progress = item_log(
            len(cands), f"validate {Path(candidates_file).parent.name}/{Path(candidates_file).stem}", log
        )

        def one(c: Candidate) -> dict[str, Any]:
            rep = validate_candidate(
                prov,
                env["template"]["template"],
                profile,
                env["commit"],
                c,
                env["reference"],
                parser=parser,
                runs=validation["runs"],
                attempts=validation["attempts"],
                require_p2p=require_p2p,
            )
            progress.update(item=c.instance_id, note=rep.get("status", ""), ok=rep.get("status") != "error")
            return rep

        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            reports = list(pool.map(one, cands))
    elif cands:
        reports = [
            {"instance_id": c.instance_id, "strategy": c.strategy, "status": "repository_skipped"}
            for c in cands
        ]
    write_jsonl(out, reports)
    counts = dict(Counter(r["status"] for r in reports))
    log.info("validated %d candidates: %s", len(reports), counts)
    return counts


# ----- gather_tasks ----------------------------------------------------------------------------------------
def gather_step(
    env_file: str | os.PathLike,
    bare: str | os.PathLike,
    reports: Sequence[str],
    candidate_files: Sequence[str],
    tasks_out: str | os.PathLike,
    git_out: str | os.PathLike,
    summary_out: str | os.PathLike,
) -> dict[str, Any]:
    """Kept candidates -> task rows (JSONL, with the bug patch and strategy) + the bare task repository +
    the summary: per strategy candidates, each outcome, kept, and the yield."""
    from ..smith.gather import gather

    env = read_json(env_file)
    by_id = {c.instance_id: c for f in candidate_files for c in read_candidates(f)}
    per: dict[str, Counter] = defaultdict(Counter)
    kept: list[tuple[Candidate, dict[str, Any]]] = []
    errors = []
    seen: set[str] = set()
    for f in reports:
        for r in read_jsonl(f):
            if r["instance_id"] in seen:
                continue
            seen.add(r["instance_id"])
            per[r["strategy"]]["candidates"] += 1
            per[r["strategy"]][r["status"]] += 1
            if r["status"] == "kept":
                kept.append((by_id[r["instance_id"]], r))
            elif r["status"] == "error":
                errors.append({"instance_id": r["instance_id"], "error": r.get("error")})
    kept.sort(key=lambda kr: kr[0].instance_id)
    rows: list[dict[str, Any]] = []
    not_tasks: list[dict[str, Any]] = []
    Path(git_out).parent.mkdir(parents=True, exist_ok=True)
    if env.get("ok"):
        profile = load_profile(env["profile"])
        rows = gather(profile, bare, env["commit"], env["date"], kept, git_out, skipped=not_tasks)
    else:  # an empty task repository: the repository was skipped
        from ..smith.gitrepo import run_git

        if not Path(git_out, "HEAD").exists():
            run_git(Path(git_out).parent, "init", "-q", "--bare", "--template=", str(Path(git_out).resolve()))
    write_jsonl(tasks_out, rows)
    strategies = {
        s: {**dict(c), "yield": round(c["kept"] / c["candidates"], 4) if c["candidates"] else 0.0}
        for s, c in sorted(per.items())
    }
    summary = {
        "repo": env["profile"]["repo"],
        "commit": env.get("commit"),
        "repository_ok": bool(env.get("ok")),
        "reference": {k: env["reference"].get(k) for k in ("ok", "reason", "tests", "share")},
        "candidates": sum(c["candidates"] for c in per.values()),
        "tasks": len(rows),
        "strategies": strategies,
        "not_gathered": not_tasks,
        "errors": errors,
    }
    atomic_write_json(summary_out, summary)
    log.info("gathered %d tasks from %d candidates: %s", len(rows), summary["candidates"], strategies)
    return summary


# ----- problem_statements ----------------------------------------------------------------------------------
def statements_step(
    tasks_files: Sequence[str],
    shard: int,
    shards: int,
    out: str | os.PathLike,
    *,
    lm: Mapping[str, Any],
    attempts: int,
) -> dict[str, int]:
    """One shard of the tasks: an issue-style statement each (checked for leaks, retried); JSONL."""
    from ..smith.statements import write_statement

    tasks = [t for f in tasks_files for t in read_jsonl(f) if shard_of(t["instance_id"], shards) == shard]
    records = []
    progress = item_log(len(tasks), f"statements {shard}/{shards}", log)
    with lm_endpoint(lm) as settings:
        for t in tasks:
            rec = write_statement(
                t,
                settings=settings,
                failing_output=t.get("failing_output", ""),
                attempts=attempts,
            )
            rec["endpoint"] = _lm_record(settings, lm)["endpoint"]
            records.append({"instance_id": t["instance_id"], **rec})
            progress.update(item=t["instance_id"], ok=bool(rec["problem_statement"]),
                            note="accepted" if rec["problem_statement"] else "rejected")  # fmt: skip
    failed = [r for r in records if not r["problem_statement"]]
    if (
        records
        and len(failed) == len(records)
        and all(
            all(request_failed({"reason": x}) for a in r["rejected"] for x in a["reasons"]) for r in failed
        )
    ):
        raise SmithError("every LM request for a problem statement failed", field="smith.lm")
    write_jsonl(out, records)
    ok = sum(1 for r in records if r["problem_statement"])
    log.info("problem statements: %d of %d accepted", ok, len(records))
    return {"tasks": len(records), "accepted": ok}


# ----- the dataset -----------------------------------------------------------------------------------------
def smith_dataset_step(
    tasks_files: Sequence[str],
    statement_files: Sequence[str],
    parquet_out: str | os.PathLike,
    report_out: str | os.PathLike,
) -> dict[str, Any]:
    """The synthesized tasks with an accepted statement, as a raw SWE-Gym-schema parquet (byte-stable);
    the report lists the tasks dropped for want of a statement."""
    from ..sample import write_parquet
    from ..smith.gather import ROW_COLUMNS

    statements = {r["instance_id"]: r for f in statement_files for r in read_jsonl(f)}
    rows, dropped = [], []
    for f in tasks_files:
        for t in read_jsonl(f):
            st = statements.get(t["instance_id"]) or {}
            if not st.get("problem_statement"):
                dropped.append({"instance_id": t["instance_id"], "rejected": st.get("rejected", [])})
                continue
            rows.append(
                {c: (st["problem_statement"] if c == "problem_statement" else t[c]) for c in ROW_COLUMNS}
            )
    rows.sort(key=lambda r: r["instance_id"])
    write_parquet(rows, parquet_out)
    report = {
        "rows": len(rows),
        "dropped": dropped,
        "strategies": dict(Counter(r["instance_id"].rsplit(".", 1)[1].split("__")[0] for r in rows)),
    }
    atomic_write_json(report_out, report)
    return report
