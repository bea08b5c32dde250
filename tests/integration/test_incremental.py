"""Only the work that changed is redone: dry runs on a finished embedded run (conftest's embedded_local_run).

- every operational key of config/keys.yaml changed at once, and the issue's single ones, plan 0 jobs;
- the same config with every mapping's keys in reverse order plans 0 jobs;
- a result-affecting key (or an operational one a rule writes into its output) plans exactly the jobs that depend on it (listed per key below);
- `snakemake --profile slurm -n` from the repository root plans the production DAG once `sweflow
  slurm-profile` installed the profile; config/swegym-docker.yaml plans its validation-only DAG.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from sweflow import params
from sweflow.config import load_config, schema
from tests.integration.conftest import EMBEDDED_CONFIGS, ROOT, snakemake_env

pytestmark = [pytest.mark.integration, pytest.mark.claude]


def plan(work: Path, *configfiles: str | Path, profile: str | None = None, env=None, cwd=None) -> dict:
    """rule -> job count of a dry run on `work` (empty: nothing to do)."""
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(work),
           "--profile", profile or str(ROOT / "profiles" / "local"), "--workflow-profile", "none", "-n",
           "--configfile", *map(str, configfiles or EMBEDDED_CONFIGS)]  # fmt: skip
    res = subprocess.run(
        cmd, capture_output=True, text=True, env=env or snakemake_env(work), cwd=cwd or work, timeout=300
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1].split("\ntotal", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def overlay(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def nested(path: tuple[str, ...], value) -> dict:
    out: dict = value
    for part in reversed(path):
        out = {part: out}
    return out


def merge(into: dict, more: dict) -> dict:
    for k, v in more.items():
        into[k] = merge(into.get(k, {}), v) if isinstance(v, dict) else v
    return into


def changed(path: tuple[str, ...], current, node: dict):
    """Another valid value for an operational key."""
    kinds = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
    name = path[-1]
    if name == "public_url":
        return "http://127.0.0.1:{port}"
    if name == "host":
        return "0.0.0.0"
    if name.endswith("api_key_env"):
        return "SWEFLOW_OTHER_KEY"
    if "enum" in node:
        return next(v for v in node["enum"] if v != current)
    if "boolean" in kinds:
        return not current
    if "integer" in kinds or "number" in kinds:
        low, high = node.get("minimum", node.get("exclusiveMinimum", 0)), node.get("maximum")
        step = 7 if "integer" in kinds else 1.5
        if high is None or (current or low) + step <= high:
            return (current or low) + step
        return (low + (current or low)) / 2 if "number" in kinds else max(low, (current or low) - 1)
    if "string" in kinds:
        return f"{current or 'x'}-other"
    if "array" in kinds:  # a list of choices (train.tracking.backends): one fewer, or the first one
        if current:
            return list(current)[:-1]
        return (
            [node["items"]["enum"][0]] if "enum" in node["items"] else ["--other"]
        )  # evaluate.vllm.extra_args
    raise AssertionError(f"no change for {'.'.join(path)} of type {kinds}")


def operational_overlay() -> dict:
    cfg = load_config(*EMBEDDED_CONFIGS)
    out: dict = {}
    keys = [p for p in params.schema_keys(schema())
            if params.kind_of(p) == "operational" and p not in params.carried()]  # fmt: skip
    assert len(keys) >= 40
    for path in keys:
        merge(out, nested(path, changed(path, params.section(cfg, ".".join(path)), params.schema_node(path))))
    load_config(*EMBEDDED_CONFIGS, overrides=out)  # every change is a valid config
    return out


def reversed_keys(node):
    if isinstance(node, dict):
        return {k: reversed_keys(node[k]) for k in reversed(list(node))}
    return node


def test_no_operational_key_and_no_key_order_reruns_anything(embedded_local_run, tmp_path):
    work = embedded_local_run
    assert plan(work) == {}
    every = overlay(tmp_path, "operational", operational_overlay())
    assert plan(work, *EMBEDDED_CONFIGS, every) == {}
    # the cases one by one: a concurrency knob, and a Docker limit while the provider is local
    for name, data in {"parallel": {"validation": {"parallel": 3}},
                       "docker": {"sandbox": {"docker": {"cpus": 3}}},
                       "e2b": {"sandbox": {"e2b": {"template_prefix": "other"}}}}.items():  # fmt: skip
        assert plan(work, *EMBEDDED_CONFIGS, overlay(tmp_path, name, data)) == {}, name
    flipped = [overlay(tmp_path, f"rev{i}", reversed_keys(yaml.safe_load(Path(f).read_text())))
               for i, f in enumerate(EMBEDDED_CONFIGS)]  # fmt: skip
    assert [list(yaml.safe_load(f.read_text())) for f in flipped][0][0] != "dataset"
    assert plan(work, *flipped) == {}


# Each result key's change and the jobs it plans: the rules that read it, and every job downstream.
# (a dry run plans the consumers of the valid_rows checkpoint; the real run skips those whose row files kept
# their bytes: test_one_changed_row_reruns_only_its_tasks_work)
DOWNSTREAM_OF_VALIDATION = {"valid_rows": 1, "collect_trajectories": 1, "e2e_check": 1, "evaluate_predictions": 1,
                            "warm_start": 1, "train_grpo": 1, "traj_to_messages": 1, "train_sft": 1,
                            "evaluate_checkpoint": 3, "report": 1, "all": 1}  # fmt: skip
# (valid_rows is planned once the validation_tasks checkpoints it waits behind have run: not in a dry run)
DOWNSTREAM_OF_CONVERT = {"validation_tasks": 3, "validation_summary": 3,
                         **{k: v for k, v in DOWNSTREAM_OF_VALIDATION.items() if k != "valid_rows"}}  # fmt: skip
RESULT_KEYS = {
    # a new GRPO checkpoint: only its own evaluation runs again (base and warm_start keep theirs)
    "train.optim.lr": (2e-4, {"train_grpo": 1, "evaluate_checkpoint": 1, "report": 1, "all": 1}),
    "evaluate.attempts": (3, {"evaluate_checkpoint": 3, "report": 1, "all": 1}),
    "sft.train.lr": (1e-4, {"train_sft": 1, "report": 1, "all": 1}),
    # a verdict-only change reaches everything downstream of validation in the same invocation: readers of
    # valid_rows ask for validation_tasks first (rules/common.smk), so they are planned after the summary
    "validation.repeats": (3, {"validate_task": 23, "validation_summary": 3, **DOWNSTREAM_OF_VALIDATION}),
    # which verdicts tasks.valid.jsonl keeps: the summaries only, no task is validated again
    "validation.allow_unguarded": (True, {"validation_summary": 3, **DOWNSTREAM_OF_VALIDATION}),
    "agent.backend_options.max_turns": (81, {"convert": 3, **DOWNSTREAM_OF_CONVERT}),
    # operational for the sandboxes, but every training row carries it (config/keys.yaml `carried`)
    "sandbox.timeout_sec": (3601, {"convert": 3, **DOWNSTREAM_OF_CONVERT}),
}


@pytest.mark.parametrize("key", sorted(RESULT_KEYS))
def test_a_result_key_plans_exactly_the_jobs_that_depend_on_it(embedded_local_run, tmp_path, key):
    value, jobs = RESULT_KEYS[key]
    assert params.kind_of(key) == "result" or tuple(key.split(".")) in params.carried()
    change = overlay(tmp_path, "change", nested(tuple(key.split(".")), value))
    assert plan(embedded_local_run, *EMBEDDED_CONFIGS, change) == jobs


CHANGED = "sweflow__calclib-5"  # a train task that neither the e2e check nor the warm start uses


def test_one_changed_row_reruns_only_its_tasks_work(embedded_local_run, tmp_path):
    """Issue 45 (5): an upstream commit changes one task (its FAIL_TO_PASS names a test the test patch does not
    add, so its verdict turns to broken). Before, that ran the e2e check, the warm start and every SFT shard,
    which bought every expert trajectory again; now the e2e check and the warm start keep their outputs and
    the SFT shard holding the task takes every other task's attempts from the trajectory cache."""
    from sweflow.offline.hub_store import HubStore
    from sweflow.offline.local_hub import SAMPLE_REPO_ID
    from sweflow.sample.tasks import parquet_bytes, skyrl_rows

    work = tmp_path / "work"
    subprocess.run(["cp", "-a", str(embedded_local_run), str(work)], check=True)
    cache = work / "resources" / "cache" / "sft-collect"
    entries = sorted(p.name for p in cache.glob("*.json.gz"))
    assert entries, "the embedded run filled the trajectory cache"
    rows = skyrl_rows("train")
    inst = next(r["instance"] for r in rows if r["instance"]["instance_id"] == CHANGED)
    inst["FAIL_TO_PASS"] = [*inst["FAIL_TO_PASS"], "tests/test_stats.py::test_not_in_the_test_patch"]
    HubStore(work / "resources" / "hub").publish(SAMPLE_REPO_ID, {"train.parquet": parquet_bytes(rows)},
                                                 "Change one task")  # fmt: skip
    env = snakemake_env(work)
    refresh = subprocess.run([sys.executable, "-m", "sweflow.cli", "refresh",
                              *(a for f in EMBEDDED_CONFIGS for a in ("--configfile", f))],
                             cwd=work, capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert refresh.returncode == 0, refresh.stdout + refresh.stderr
    keep = {p: p.read_bytes() for p in (work / "results/sample/e2e").glob("*")}
    warm = sorted((work / "results/sample/warm_start").iterdir())[0].name
    targets = [*(f"results/sample/{s}/validation-summary.json" for s in ("train", "validation")),
               "results/sample/e2e/sweflow__calclib-3.json", f"results/sample/warm_start/{warm}/summary.json",
               "results/sample/sft/messages/summary.json"]  # fmt: skip
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(work),
           "--profile", str(ROOT / "profiles" / "local"), "--workflow-profile", "none",
           "--configfile", *EMBEDDED_CONFIGS, "--", *targets]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    ran = Counter(m[1] for m in re.finditer(r"^\s*(?:local)?(?:rule|checkpoint) (\w+):$", out, re.M))
    print("jobs run:", dict(ran))
    assert CHANGED not in (work / "results/sample/train/tasks.valid.jsonl").read_text()  # its verdict changed
    # one task validated again; no e2e check, no warm start (its input is asked for after the valid_rows
    # checkpoints, so it is planned again with the check); one SFT shard (there is one)
    assert ran["validate_task"] == 1 and ran["valid_rows"] == 1, ran
    assert not {"e2e_check", "warm_start", "train_grpo", "train_sft"} & set(ran), ran
    assert ran["collect_trajectories"] <= 1 and ran["evaluate_predictions"] <= 1, ran
    assert all(p.read_bytes() == data for p, data in keep.items())
    # no expert attempt bought again: every task left in the shard came from the cache
    text = (work / "logs/sample/collect_trajectories/train/0.log").read_text()
    m = re.search(r"(\d+) tasks from the cache, (\d+) collected", text)
    assert m and int(m[2]) == 0 and int(m[1]) >= 1, text[-2000:]
    assert not re.search(r"collected \S+ attempt \d", text), text[-2000:]
    ids = json.loads((work / "results/sample/sft/messages/summary.json").read_text())["trajectory_ids"]
    assert ids and not [i for i in ids if i.startswith(f"{CHANGED}.")]
    assert set(entries) <= {p.name for p in cache.glob("*.json.gz")}


FAKE_CONDA = """#!/bin/sh
# Snakemake asks conda only for its version and settings while planning; this machine has none.
case "$1" in
  --version) echo "conda 24.11.0";;
  info) echo '{"conda_version": "24.11.0", "envs_dirs": ["%(d)s/envs"], "platform": "linux-64",
        "root_prefix": "%(d)s", "conda_prefix": "%(d)s", "channels": []}';;
  config) echo '{"get": {"channel_priority": "strict"}}';;
  *) exit 1;;
esac
"""


def test_snakemake_profile_slurm_plans_the_production_dag_after_the_setup_step(tmp_path):
    from tests.fixtures.harness_swegym import write_swegym_harness

    xdg, work, bin_dir = tmp_path / "xdg", tmp_path / "work", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "conda").write_text(FAKE_CONDA % {"d": tmp_path / "conda"})
    (bin_dir / "conda").chmod(0o755)
    write_swegym_harness(tmp_path / "pkgs", "swegym")
    env = {**snakemake_env(work), "XDG_CONFIG_HOME": str(xdg), "E2B_API_KEY": "e2b_" + "0" * 40,
           "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"}  # fmt: skip
    site = ROOT / "tests" / "fixtures" / "site.yaml"
    cmd = [sys.executable, "-m", "snakemake", "--profile", "slurm", "-n", "--directory", str(work),
           "--configfile", "config/swegym-e2b.yaml", str(site)]  # fmt: skip
    before = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert before.returncode != 0 and "profile directory given (slurm)" in before.stderr
    setup = subprocess.run(
        [sys.executable, "-m", "sweflow.cli", "slurm-profile", "--account", "lab-7", "--cpu-partition", "short",
         "--gpu-partition", "a100"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert setup.returncode == 0, setup.stderr
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "Using profile slurm" in out
    for rule in ("resolve_dataset", "download", "convert", "resolve_model", "download_model",
                 "train_grpo", "report"):  # fmt: skip
        assert f"rule {rule}:" in out or f"checkpoint {rule}:" in out, rule
    # Megatron-Bridge loads the Hugging Face weights when the actor starts: no separate conversion job
    assert "rule megatron_checkpoint:" not in out
    grpo = out.split("rule train_grpo:", 1)[1].split("\n\n", 1)[0]
    assert "slurm_partition=a100" in grpo and "slurm_account=lab-7" in grpo and "nodes=4" in grpo
    # without the site's proxy URL the same command stops before any job, naming the key
    bare = subprocess.run(cmd[:-1], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert bare.returncode != 0 and "train.proxy.public_url" in bare.stderr and "Job stats" not in bare.stdout


def test_the_docker_rung_plans_validation_and_no_training(tmp_path):
    from tests.fixtures.harness_swegym import write_swegym_harness

    write_swegym_harness(tmp_path / "pkgs", "swegym")
    work = tmp_path / "work"
    work.mkdir()
    env = {**snakemake_env(work), "PYTHONPATH": f"{tmp_path / 'pkgs'}:{ROOT}"}
    jobs = plan(work, ROOT / "config" / "swegym-docker.yaml", env=env)
    assert {"resolve_dataset", "download", "validate_split", "list_images", "convert", "validation_tasks",
            "validation_summary", "report"} <= set(jobs), jobs  # fmt: skip
    assert not {"train_grpo", "warm_start", "download_model", "collect_trajectories", "e2e_check"} & set(jobs)
    assert jobs["download"] == 2 and jobs["convert"] == 2  # the train and validation splits
