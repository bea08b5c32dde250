"""The README's "Using it for real" path under real Snakemake: a user's one-split config plans only its own
jobs, config errors are one line before any job, and a URL with credentials reaches neither
.snakemake/metadata, provenance, logs nor stderr (of a passing or a failing run)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sweflow.sample import skyrl_rows, write_parquet

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECRET = "pw-s3cret-Q7"  # no token shape, not in the environment: only the URL rule can catch it
CRED_URL = f"http://alice:{SECRET}@127.0.0.1:9/hub"


def snakemake(work: Path, *args: str, configfile: Path | None = None, profile: str | None = None):
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        *args,  # targets before --configfile, which takes every word after it
        "--snakefile",
        str(ROOT / "Snakefile"),
        "--directory",
        str(work),
    ]
    cmd += ["--profile", profile] if profile else ["--workflow-profile", "none", "--cores", "1"]
    if configfile:
        cmd += ["--configfile", str(configfile)]
    env = {
        **os.environ,
        "HF_HOME": str(work / ".hf"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def planned(res: subprocess.CompletedProcess) -> list[tuple[str, str]]:
    """(rule, wildcards) of every job in a dry run's plan."""
    jobs, rule = [], None
    for line in res.stdout.splitlines():
        m = re.match(r"^(?:local)?(?:rule|checkpoint) (\w+):$", line.strip())
        if m:
            rule = m.group(1)
            jobs.append((rule, ""))
        elif rule and line.strip().startswith("wildcards: ") and jobs[-1][1] == "":
            jobs[-1] = (rule, line.strip()[len("wildcards: ") :])
    return jobs


def one_split_config(work: Path, **hub) -> Path:
    """A real user's config: one split `dev`, an offline folder, no select_splits, no e2e.instance."""
    data = work / "data"
    data.mkdir(exist_ok=True)
    write_parquet(skyrl_rows("validation"), data / "dev.parquet")
    cfg = {
        "dataset": {
            "name": "mine",
            "repo_id": "me/tasks",
            "hub": {"offline_dir": str(data), **hub},
            "splits": {"dev": {"file": "dev.parquet", "rows": 2}},
        },
        "harness": {"extra_repos": "sample"},
    }
    path = work / "mine.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_one_split_user_config_plans_only_its_own_jobs(tmp_path):
    res = snakemake(tmp_path, "-n", configfile=one_split_config(tmp_path))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    jobs = planned(res)
    rules = {r for r, _ in jobs}
    assert {"resolve_dataset", "download", "validate_split", "convert", "validation_summary", "all"} <= rules
    assert "e2e_check" not in rules
    splits = {m.group(1) for _, w in jobs for m in [re.search(r"split=([\w-]+)", w)] if m}
    assert splits == {"dev"}
    assert "train" not in res.stdout and "results/mine/validation.jsonl" not in res.stdout


def test_no_config_file_keeps_the_embedded_sample(tmp_path):
    res = snakemake(tmp_path, "-n")
    assert res.returncode == 0, res.stderr[-3000:]
    jobs = planned(res)
    splits = {m.group(1) for _, w in jobs for m in [re.search(r"split=([\w-]+)", w)] if m}
    assert splits == {"train", "validation"}
    assert ("e2e_check", "dataset=sample, instance_id=sweflow__calclib-3") in jobs


def test_config_error_is_one_line_before_any_job(tmp_path):
    cfg = one_split_config(tmp_path)
    cfg.write_text(cfg.read_text() + "sandbox:\n  docker:\n    mem_mbb: 100\n")
    res = snakemake(tmp_path, configfile=cfg)
    assert res.returncode == 1
    assert res.stdout.strip() == "", res.stdout
    lines = res.stderr.strip().splitlines()
    assert lines == [
        f"sweflow: {cfg}:14: field 'sandbox.docker.mem_mbb': unknown key (did you mean 'sandbox.docker.mem_mb'?)"
    ]
    assert not (tmp_path / "resources").exists() and not (tmp_path / "logs").exists()


def test_e2b_without_its_key_stops_before_any_job(tmp_path):
    cfg = one_split_config(tmp_path)
    cfg.write_text(cfg.read_text() + "sandbox:\n  provider: e2b\n")
    env_key = os.environ.pop("E2B_API_KEY", None)
    try:
        res = snakemake(tmp_path, configfile=cfg)
    finally:
        if env_key is not None:
            os.environ["E2B_API_KEY"] = env_key
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "field 'sandbox.provider': the e2b provider needs E2B_API_KEY" in res.stderr


def test_slurm_profile_is_understood(tmp_path):
    res = snakemake(tmp_path, "-n", profile="profiles/slurm")
    out = res.stdout + res.stderr
    assert "invalid choice: 'slurm'" not in out, out[-2000:]
    assert "Building DAG of jobs" in out or res.returncode == 0, out[-2000:]


def _leaks(work: Path, res: subprocess.CompletedProcess) -> list[str]:
    found = [name for name, text in (("stdout", res.stdout), ("stderr", res.stderr)) if SECRET in text]
    for path in work.rglob("*"):
        if path.is_file() and not path.is_relative_to(work / "data") and path.name != "mine.yaml":
            if SECRET.encode() in path.read_bytes():
                found.append(str(path.relative_to(work)))
    return found


def test_url_credentials_reach_no_param_metadata_record_or_log(tmp_path):
    cfg = one_split_config(tmp_path, endpoint=CRED_URL)
    res = snakemake(tmp_path, "resources/datasets/mine/dev.parquet", configfile=cfg)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert list((tmp_path / ".snakemake/metadata").iterdir()), "metadata was recorded"
    assert list((tmp_path / ".provenance").rglob("*.json")), "provenance was recorded"
    assert _leaks(tmp_path, res) == []
    metadata = "".join(p.read_text() for p in (tmp_path / ".snakemake/metadata").iterdir())
    assert "http://***REDACTED***@127.0.0.1:9/hub" in metadata  # the host still triggers reruns


def test_url_credentials_stay_out_of_a_failing_run(tmp_path):
    cfg = one_split_config(tmp_path, offline_dir=None, endpoint=CRED_URL, download_attempts=1, timeout_sec=2)
    res = snakemake(tmp_path, "resources/datasets/mine/revision.json", configfile=cfg)
    assert res.returncode != 0
    assert "sweflow: " in res.stderr and "127.0.0.1:9" in res.stderr, res.stderr[-3000:]
    assert _leaks(tmp_path, res) == []
