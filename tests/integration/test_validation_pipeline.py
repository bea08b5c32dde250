"""The validate_tasks rules under real Snakemake: local Hub -> JSONL -> per-task validation (Docker) ->
summary and tasks.valid.jsonl; a second run does nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sweflow.offline.hub_store import HubStore
from sweflow.offline.local_hub import publish_sample, serve
from sweflow.sample import SPLITS, load_task

try:
    from tests.integration.conftest_validation import docker_available
except ModuleNotFoundError:  # pragma: no cover
    from conftest_validation import docker_available  # type: ignore[no-redef]

pytestmark = [pytest.mark.integration, pytest.mark.docker]
ROOT = Path(__file__).resolve().parents[2]


def _snakefile(work: Path) -> Path:
    """The project Snakefile, plus rules/validate.smk when the Snakefile does not include it yet."""
    main = ROOT / "Snakefile"
    if "rules/validate.smk" in main.read_text():
        return main
    # Until then: a wrapper beside links to the project files the workflow reads from its base directory.
    wf = work.parent / "workflow"
    wf.mkdir(exist_ok=True)
    for name in ("pyproject.toml", "sweflow", "config"):
        if not (wf / name).exists():
            (wf / name).symlink_to(ROOT / name)
    wrapper = wf / "Snakefile"
    wrapper.write_text(f'include: "{main}"\ninclude: "{ROOT / "rules" / "validate.smk"}"\n')
    return wrapper


def snakemake(work: Path, *targets: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(_snakefile(work)), "--directory", str(work),
           "--configfile", str(work / "config.yaml"), "--workflow-profile", "none", "--cores", "2", *targets]  # fmt: skip
    env = {**os.environ, "HF_HOME": str(work / ".hf")}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, f"snakemake failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res


TARGETS = [
    "results/sample/validation/validation-summary.json",
    "results/sample/validation/tasks.valid.jsonl",
]


def _prepare(tmp_path: Path) -> tuple[list[str], Path, Path]:
    """Docker images of the two validation tasks, the sample published to a local Hub folder, and an empty
    work folder; skips without Docker or swebench. Returns (ids, hub folder, work folder)."""
    why = docker_available()
    if why:
        pytest.skip(why)
    pytest.importorskip("swebench")
    from sweflow.sandbox.images import build_sample_images

    ids = SPLITS["validation"]
    build_sample_images([load_task(i) for i in ids])
    hub = tmp_path / "hub"
    publish_sample(hub)
    work = tmp_path / "work"
    work.mkdir()
    return ids, hub, work


def _write_config(work: Path, url: str, validation: dict) -> None:
    cfg = {
        "dataset": {
            "hub": {"endpoint": url},
            "splits": {"validation": {"file": "validation.parquet", "rows": 2}},
        },
        "images": {"prefix": "sweflow-sample/sweb.eval.x86_64."},
        "harness": {"package": "swebench", "extra_repos": "sample"},
        "sandbox": {"provider": "docker", "prebuilt": True},
        "validation": validation,
    }
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))


def test_validation_rules_on_two_tasks(tmp_path):
    ids, hub, work = _prepare(tmp_path)
    with serve(HubStore(hub)) as url:
        _write_config(work, url, {"repeats": 2, "parallel": 1})
        targets = TARGETS
        first = snakemake(work, *targets)
        out = first.stdout + first.stderr
        assert out.count("rule validate_task:") == 2 and "checkpoint validation_tasks:" in out
        res = work / "results/sample/validation"
        summary = json.loads((res / "validation-summary.json").read_text())
        assert (summary["tasks"], summary["valid"], summary["broken"], summary["errors"]) == (2, 2, [], [])
        for iid in ids:
            rec = json.loads((res / "validation" / f"{iid}.json").read_text())
            assert rec["verdict"] == "valid" and rec["provider"] == "docker"
            # gold and empty twice each, then one decoy run of the gold patch where it carried F2P twins
            twins = any(r["f2p_twins"] for r in rec["runs"] if r["patch"] == "gold")
            assert rec["decoys"] == int(twins) and len(rec["runs"]) == 4 + rec["decoys"], rec["runs"]
            task = json.loads((work / f"results/sample/validation/validation-tasks/{iid}.json").read_text())
            assert task["gold_patch"] == load_task(iid)["patch"]
            from sweflow.grading.evidence import read_evidence

            evidence = read_evidence(res / "validation" / f"{iid}.evidence.jsonl.gz")
            assert sorted((e["patch"], e["run"]) for e in evidence) == sorted(
                (r["patch"], r["run"]) for r in rec["runs"]
            )
            assert all(e["log"] and e["statuses"] for e in evidence), "every run's whole log and status map"
            assert (work / f"logs/sample/validate_task/validation/{iid}.log").exists()
        jsonl = (work / "results/sample/validation.jsonl").read_text()
        assert (res / "tasks.valid.jsonl").read_text() == jsonl
        assert load_task(ids[0])["patch"].strip() not in jsonl
        again = snakemake(work, *targets)
        assert "Nothing to be done" in again.stdout + again.stderr


def test_an_infrastructure_failure_is_an_error_verdict_that_the_next_run_retries(tmp_path):
    """A task whose sandbox cannot be created is `error` (not broken, not valid); once the provider is
    healthy again, the next run validates that task alone and the summary takes it in."""
    from sweflow.sandbox.images import sample_image_name

    ids, hub, work = _prepare(tmp_path)
    image = sample_image_name(ids[1], prefix="sweflow-sample")
    hidden = f"sweflow-test-hidden/{ids[1].lower()}:{os.getpid()}"
    docker = ["docker", "image", "tag"]
    with serve(HubStore(hub)) as url:
        _write_config(work, url, {"repeats": 1, "parallel": 1, "error_attempts": 2, "error_backoff_sec": 0.1})
        targets = TARGETS
        snakemake(work, "results/sample/validation.jsonl")  # the task is converted while its image exists
        subprocess.run([*docker, image, hidden], check=True, capture_output=True)
        subprocess.run(["docker", "image", "rm", image], check=True, capture_output=True)
        try:
            snakemake(work, *targets)  # the run goes on: the other task is validated
        finally:
            subprocess.run([*docker, hidden, image], check=True, capture_output=True)
            subprocess.run(["docker", "image", "rm", hidden], check=True, capture_output=True)
        res = work / "results/sample/validation"
        summary = json.loads((res / "validation-summary.json").read_text())
        assert (summary["valid"], summary["broken"], summary["verdicts"]["error"]) == (1, [], 1)
        (err,) = summary["errors"]
        assert err["instance_id"] == ids[1] and "fresh_eval_exception" in err["reason"], err
        # the error result is removed (so the next run retries the task); the evidence of every try stays
        assert not (res / "validation" / f"{ids[1]}.json").exists()
        from sweflow.grading.evidence import read_evidence

        tries = read_evidence(res / "validation" / f"{ids[1]}.evidence.jsonl.gz")
        assert sorted(e["patch"] for e in tries) == ["empty", "empty", "gold", "gold"], tries
        assert {e["failure_reason"] for e in tries} == {"fresh_eval_exception"}
        summary_log = (work / "logs/sample/validation_summary/validation.log").read_text()
        assert "could NOT be validated" in summary_log and ids[1] in summary_log
        valid_ids = [
            json.loads(line)["metadata"]["instance_id"] for line in (res / "tasks.valid.jsonl").open()
        ]
        assert valid_ids == [ids[0]]

        second = snakemake(work, *targets)  # the provider is healthy again: only the error task re-runs
        out = second.stdout + second.stderr
        assert out.count("rule validate_task:") == 1 and f"instance_id={ids[1]}" in out.replace(" ", "")
        summary = json.loads((res / "validation-summary.json").read_text())
        assert (summary["valid"], summary["errors"], summary["broken"]) == (2, [], [])
        assert json.loads((res / "validation" / f"{ids[1]}.json").read_text())["verdict"] == "valid"
        third = snakemake(work, *targets)
        assert "Nothing to be done" in third.stdout + third.stderr
