"""profiles/slurm against a real Slurm (.ci/slurm.sh: one controller, two slurmd nodes n1 and n2 with a
fake GPU each, partitions cpu and gpu, no accounting database), with the small test overlay
tests/slurm_profile/config.yaml (account, status command, software deployment off).

- the embedded default runs through it (with tests/fixtures/two_nodes.yaml, as the local-profile run of
  tests/integration/conftest.py): every rule that is not a localrule is a Slurm job (its provenance names
  the job, nodes and partition), the byte-stable outputs equal the local-profile run's, and a second run
  does nothing;
- its train_grpo is ONE 2-node Slurm job: TRL data-parallel GRPO with one process per node (gloo), both
  ranks ending with the same weights;
- verl's launch script in a 2-node allocation: a Ray cluster over both nodes, checked by the preflight
  driver together with the composed trainer config (no GPU here: it stops before verl's trainer);
- faults (a small workflow run beside the embedded one): a cancelled job is retried, a job past its time
  limit is reported with its Slurm job id and log, the other jobs finish, and a rerun completes the run;
- the production recipe's training job asks Slurm for 4 nodes x 8 GPUs, exclusive (the sbatch options
  the plugin generated, as the real sbatch refused them on this 2-node cluster).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from sweflow.util import sha256_file
from tests.integration.conftest import EMBEDDED_CONFIGS, ROOT, merged_profile, snakemake_env

pytestmark = [pytest.mark.integration, pytest.mark.claude, pytest.mark.slurm]
RUN = "results/sample/grpo/tiny"


FAST_POLL = ROOT / "tests" / "slurm_profile" / "fast_poll.py"


def snakemake(work: Path, profile: Path, *args: str, timeout: int = 1800, env=None):
    cmd = [sys.executable, str(FAST_POLL), "--snakefile", str(ROOT / "Snakefile"), "--directory", str(work),
           "--profile", str(profile), "--workflow-profile", "none", *args]  # fmt: skip
    # `timeout -k`: the plugin's status polling has been seen to ignore SIGTERM
    full = ["timeout", "-k", "20", str(timeout), *cmd]
    t0 = time.monotonic()
    res = subprocess.run(
        full, capture_output=True, text=True, env=env or snakemake_env(work), timeout=timeout + 60
    )
    res.seconds = time.monotonic() - t0
    return res


# The embedded default without the SWE-smith branch (tests/fixtures/no_smith.yaml): CI's time.
SLURM_CONFIGS = [*EMBEDDED_CONFIGS, str(ROOT / "tests" / "fixtures" / "no_smith.yaml")]
REPORT = "results/sample/report.html"
SMITH_PATHS = re.compile(
    r"^(results/smith/|results/smith-calclib/|resources/datasets/smith-calclib/|results/sample/sft/)"
)


def local_rules() -> set[str]:
    """Rules marked `localrule: True` in rules/*.smk, plus the Snakefile's target rules."""
    names = set()
    for smk in (ROOT / "rules").glob("*.smk"):
        for block in re.split(r"\n(?=(?:rule|checkpoint) \w+:)", smk.read_text()):
            m = re.match(r"(?:rule|checkpoint) (\w+):", block)
            if m and "localrule: True" in block:
                names.add(m.group(1))
    return names


def records(work: Path) -> dict[str, dict]:
    return {
        str(p.relative_to(work / ".provenance"))[: -len(".json")]: json.loads(p.read_text())
        for p in (work / ".provenance").rglob("*.json")
    }


class FaultRun:
    """The fault workflow (tests/fixtures/slurm_faults) through profiles/slurm, started in the background
    (its jobs mostly sleep, so it shares the cluster with the embedded run without slowing it), with a
    watcher that scancels the `cancelled` rule's first attempt once it runs."""

    def __init__(self, work: Path, profile: Path) -> None:
        self.work, self.profile = work, profile
        self.stop, self.cancelled = threading.Event(), []
        self.watcher = threading.Thread(
            target=_cancel_when_running, args=("rule_cancelled", self.stop, self.cancelled), daemon=True
        )
        self.watcher.start()
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=snakemake_env(work))  # fmt: skip
        self.out: list[str] = []
        self.seconds = 0.0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        self.out.append(self.proc.stdout.read())
        self.proc.wait()
        self.seconds = time.monotonic() - self.t0

    def cmd(self, *args: str, timeout: int = 600) -> list[str]:
        return ["timeout", "-k", "20", str(timeout), sys.executable, "-m", "snakemake", "--snakefile",
                str(ROOT / "tests" / "fixtures" / "slurm_faults" / "Snakefile"), "--directory", str(self.work),
                "--profile", str(self.profile), "--workflow-profile", "none", *args]  # fmt: skip

    def result(self) -> tuple[int, str, float]:
        self.reader.join(timeout=900)
        self.stop.set()
        return self.proc.returncode, "".join(self.out), self.seconds


@pytest.fixture(scope="module")
def slurm_run(slurm_cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("embedded-slurm")
    profile = merged_profile(tmp_path_factory.mktemp("profile"))
    fault_work = tmp_path_factory.mktemp("faults")
    faults = FaultRun(fault_work, profile)
    res = snakemake(work, profile, "--configfile", *SLURM_CONFIGS)
    fault_result = faults.result()
    assert res.returncode == 0, f"snakemake under Slurm failed:\n{res.stdout[-4000:]}\n{res.stderr[-8000:]}"
    print(f"embedded default under profiles/slurm: {res.seconds:.0f} s; fault run: {fault_result[2]:.0f} s")
    return {"work": work, "profile": profile, "res": res, "faults": faults, "fault_result": fault_result}


def test_every_rule_but_the_local_ones_ran_as_a_slurm_job(slurm_run, slurm_cluster):
    recs = records(slurm_run["work"])
    local = local_rules()
    assert {"resolve_dataset", "download", "claude_code", "download_model"} <= local
    jobs = {}
    for name, rec in recs.items():
        if rec["rule"] in local:
            assert rec["slurm"] is None, name
            continue
        slurm = rec["slurm"]
        assert slurm and re.fullmatch(r"\d+", slurm["job_id"]), name
        assert slurm["nodes"] and set(slurm["nodes"]) <= set(slurm_cluster["nodes"]), (name, slurm)
        # the profile's GPU rules: training, and a checkpoint's evaluation (its model server)
        gpu = rec["rule"] in ("train_grpo", "evaluate_checkpoint")
        assert slurm["partition"] == ("gpu" if gpu else "cpu"), (name, slurm)
        jobs.setdefault(rec["rule"], set()).add(slurm["job_id"])
    assert {"validate_task", "build_template", "warm_start", "train_grpo", "e2e_check"} <= set(jobs)
    # one job per validated task: the per-item rules were not batched into one
    assert len(jobs["validate_task"]) >= 6
    err = slurm_run["res"].stderr
    assert len(re.findall(r"has been submitted with SLURM jobid \d+", err)) == len(
        set().union(*jobs.values())
    )


# Fields that measure the run rather than the result: durations, absolute paths of the work folder, the
# random suffix of proxy session ids, a build's random id, a test log's own timing line (and the log, which
# holds the randomly drawn canary tests).
VOLATILE = re.compile(
    # nodes: the training summary names the Slurm nodes (none on the local run)
    r"^(timings|seconds|train_seconds|duration|started|ended|build_id|path|output_tail|log|nodes|.*_s)$"
)


def _canaries(value):
    """The host's canary tests are drawn at random per evaluation (their file, names and originals): what
    must be the same in two runs is how many of each kind ran and what they reported. A FAIL_TO_PASS twin's
    outcome on code that fails its test is left out: a drawn twin may hit the wrong value itself (calclib-5's
    empty-patch runs), which no verdict reads."""
    if isinstance(value, list):
        return sorted((c.get("expect"), c.get("of"), None if c.get("of") == "f2p" else c.get("got"))
                      for c in value if isinstance(c, dict))  # fmt: skip
    return value


def stable(obj, work: Path):
    """A JSON value without its VOLATILE fields; the work folder's path and session suffixes masked."""
    if isinstance(obj, dict):
        return {
            k: _canaries(v) if k == "canaries" else stable(v, work)
            for k, v in obj.items()
            if not VOLATILE.match(k)
        }
    if isinstance(obj, list):
        return [stable(v, work) for v in obj]
    if isinstance(obj, str):
        obj = obj.replace(str(work), "<work>")
        return re.sub(r"(:\d+):[0-9a-f]{8}\b", r"\1:<sid>", obj)
    return obj


def stable_content(path: Path, work: Path):
    """What an artifact says, as comparable data: JSON / JSONL (gzip too) normalised, anything else bytes."""
    import gzip

    if path.is_dir():
        return {
            str(p.relative_to(path)): stable_content(p, work) for p in sorted(path.rglob("*")) if p.is_file()
        }
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    name = path.name.removesuffix(".gz")
    if name.endswith(".json"):
        return stable(json.loads(raw), work)
    if name.endswith(".jsonl"):
        return [stable(json.loads(x), work) for x in raw.decode().splitlines() if x.strip()]
    return raw


def test_byte_stable_outputs_equal_the_local_profile_run(slurm_run, embedded_local_run):
    """Every artifact of the run manifest is the same as the local-profile run's: byte for byte, or (records
    that also hold timings, paths and session ids) equal once those are set aside. The model weights (warm
    start, GRPO checkpoints, final) are byte-identical."""

    def manifest(work):
        m = json.loads((work / "results/sample/manifest.json").read_text())
        return {a["path"]: a["sha256"] for a in m["artifacts"]}

    work_s, work_l = slurm_run["work"], embedded_local_run
    slurm, local = manifest(work_s), manifest(work_l)
    local = {
        p: h for p, h in local.items() if not SMITH_PATHS.match(p)
    }  # the Slurm run has no smith or SFT branch
    # the report is a view of the artifacts compared here (it also shows step times, and the local run's
    # smith and SFT sections): both runs wrote one
    assert slurm.pop(REPORT) and local.pop(REPORT)
    assert set(slurm) == set(local)
    same = [p for p in slurm if slurm[p] == local[p]]
    differ = sorted(p for p in slurm if slurm[p] != local[p])
    for p in differ:
        assert stable_content(work_s / p, work_s) == stable_content(work_l / p, work_l), p
    print(f"{len(same)} artifacts byte-identical, {len(differ)} equal once timings/paths are set aside")
    for p in ("results/sample/grpo/tiny/final", "results/sample/warm_start/sweflow--tiny-qwen3-swa/hf",
              "results/sample/train.jsonl", "results/sample/train/tasks.valid.jsonl",
              "results/sample/template-map.json"):  # fmt: skip
        assert p in same, p
    s_sum = json.loads((work_s / RUN / "summary.json").read_text())
    l_sum = json.loads((work_l / RUN / "summary.json").read_text())
    assert s_sum["final_weights"] == l_sum["final_weights"]
    assert [c["weights"] for c in s_sum["checkpoints"]] == [c["weights"] for c in l_sum["checkpoints"]]


def test_a_second_run_under_slurm_does_nothing(slurm_run):
    res = snakemake(
        slurm_run["work"], slurm_run["profile"], "-n", "--configfile", *SLURM_CONFIGS, timeout=300
    )
    assert res.returncode == 0 and "Nothing to be done" in res.stdout + res.stderr, res.stdout[-3000:]


def test_train_grpo_is_one_two_node_job_training_data_parallel(slurm_run, slurm_cluster):
    """The embedded run's training (tests/fixtures/two_nodes.yaml): ONE Slurm job of 2 nodes (--exclusive),
    torchrun on each node (srun --overlap), one rendezvous, both ranks rolling out their groups and ending
    with identical weights."""
    work = slurm_run["work"]
    rec = json.loads((work / ".provenance" / f"{RUN}/summary.json.json").read_text())
    assert rec["slurm"]["nodes"] == slurm_cluster["nodes"][:2] and rec["slurm"]["partition"] == "gpu"
    summary = json.loads((work / RUN / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["nodes"] == rec["slurm"]["nodes"]
    logs = work / RUN / "work" / "logs"
    ranks = [json.loads((logs / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"] == summary["weights_sha256"]
    for r in (0, 1):
        text = (logs / f"rank-{r}.log").read_text()
        assert f"rank {r} of 2" in text and f"rank {r} done" in text and "completed reward=" in text
    metrics = [json.loads(x) for x in (work / RUN / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["samples"] == 8 == m["completed"] + m["aborted"] for m in metrics)
    # it trained: a group with reward variance (seeded sampling: the same every run) moved the weights
    assert summary["groups_with_gradient"] >= 1
    warm = work / "results/sample/warm_start/sweflow--tiny-qwen3-swa/hf"
    assert summary["final_weights"] != {p.name: sha256_file(p) for p in warm.glob("*.safetensors")}
    # the allocation Slurm gave the job (still known to slurmctld: MinJobAge 1800 s in .ci/slurm.sh; the run
    # goes on after training for the evaluations and the report)
    job = subprocess.run(["scontrol", "show", "job", "-o", rec["slurm"]["job_id"]], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert "NumNodes=2 " in job and "NumTasks=2 " in job and "OverSubscribe=NO" in job, job
    assert "Partition=gpu" in job and "JobState=COMPLETED" in job, job


# ------------------------------------------------------------------------------------------------ faults


def _cancel_when_running(comment: str, stop: threading.Event, cancelled: list[str]) -> None:
    """scancel the first job whose comment names `comment` once it runs (the plugin comments the rule)."""
    while not stop.is_set():
        out = subprocess.run(["squeue", "-h", "-o", "%i|%T|%k"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            job, state, note = line.split("|", 2)
            if comment in note and state == "RUNNING":
                time.sleep(2)
                subprocess.run(["scancel", job], check=False)
                cancelled.append(job)
                return
        time.sleep(1)


def test_cancelled_and_overtime_jobs_are_retried_reported_and_recovered(slurm_run):
    faults: FaultRun = slurm_run["faults"]
    rc, out, seconds = slurm_run["fault_result"]
    work = faults.work
    assert rc != 0, out[-3000:]  # overtime failed for good
    assert len(faults.cancelled) == 1, out[-3000:]
    # the cancelled job: reported with its id and log, then retried (the profile's retries: 1) and done
    assert re.search(rf"SLURM-job '{faults.cancelled[0]}' failed, SLURM status is: 'CANCELLED", out), out[
        -4000:
    ]
    assert (work / "cancelled.txt").read_text() == "done\n"
    # the job past its 1-minute limit: reported with its job id, status and log path
    m = re.search(r"SLURM-job '(\d+)' failed, SLURM status is: 'TIMEOUT", out)
    assert m, out[-4000:]
    assert re.search(rf"slurm_logs/rule_overtime/{m.group(1)}\.log", out), out[-4000:]
    assert not (work / "overtime.txt").exists()
    # keep-going: the independent work finished
    assert (work / "ok.txt").exists() and (work / "after_ok.txt").exists()
    # a rerun (the profile's rerun-incomplete) finishes only what is missing
    res2 = subprocess.run(faults.cmd("--config", "fast=1", timeout=400), capture_output=True, text=True,
                          env=snakemake_env(work), timeout=460)  # fmt: skip
    assert res2.returncode == 0, (res2.stdout + res2.stderr)[-3000:]
    ran = re.findall(r"rule (\w+):", res2.stdout + res2.stderr)
    assert sorted(set(ran) - {"all"}) == ["overtime"], ran
    assert (work / "overtime.txt").read_text() == "done\n"


# ------------------------------------------------------------------------------------ production sbatch


def test_the_production_training_job_asks_for_four_exclusive_nodes_of_eight_gpus(slurm_cluster, tmp_path):
    """config/swegym-e2b.yaml's train_grpo, with its inputs in place: the dry run plans it with 4 nodes and
    gpu:8 per node; submitted for real, the plugin's sbatch call carries those options and Slurm holds the job
    as asked (4 nodes, 8 GPUs per node, exclusive, partition gpu), pending on this 2-node cluster until cancelled."""
    from tests.fixtures.harness_swegym import write_swegym_harness

    work = tmp_path / "prod"
    cfg = yaml.safe_load((ROOT / "config" / "swegym-e2b.yaml").read_text())
    name, run = cfg["dataset"]["name"], cfg["train"]["run"]
    split = cfg["train"].get("split", "train")
    model = cfg["train"]["model"].get("name") or cfg["train"]["model"]["repo_id"].replace("/", "--")
    for path in (f"results/{name}/{split}/tasks.valid.jsonl", f"results/{name}/template-map.json",
                 f"results/{name}/{split}/validation-summary.json"):  # fmt: skip
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text("{}\n")
    for folder in (f"models/{model}/hf", f"models/{model}/torch_dist"):
        (work / folder).mkdir(parents=True, exist_ok=True)
        (work / folder / "x").write_text("x")
    pkgs = tmp_path / "pkgs"
    write_swegym_harness(pkgs, "swegym")
    env = {**snakemake_env(work), "PYTHONPATH": f"{pkgs}:{ROOT}", "E2B_API_KEY": "e2b_" + "0" * 40}
    # the user profile as it is (its set-threads too), only with this cluster's account and status command
    profile = merged_profile(tmp_path / "profile", {"set-threads": {"train_grpo": 16}})
    target = f"results/{name}/grpo/{run}/summary.json"
    site = ROOT / "tests" / "fixtures" / "site.yaml"  # the proxy URL a site sets
    args = (
        target,
        "--allowed-rules",
        "train_grpo",
        "--configfile",
        str(ROOT / "config" / "swegym-e2b.yaml"),
        str(site),
    )
    dry = snakemake(work, profile, "-n", *args, timeout=300, env=env)
    assert dry.returncode == 0, (dry.stdout + dry.stderr)[-3000:]
    plan = dry.stdout + dry.stderr
    assert "rule train_grpo:" in plan and re.search(r"\bnodes=4\b", plan) and "gres=gpu:8" in plan, plan[
        -3000:
    ]
    assert "mpi=srun" in plan and "--exclusive" in plan, plan[-3000:]

    cmd = ["timeout", "-k", "20", "300", sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
           "--directory", str(work), "--profile", str(profile), "--workflow-profile", "none", "--retries", "0",
           "--verbose", *args]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    job = None
    deadline = time.monotonic() + 120
    while job is None and time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-o", "%i|%k"], capture_output=True, text=True).stdout
        job = next((ln.split("|")[0] for ln in out.splitlines() if "rule_train_grpo" in ln), None)
        time.sleep(1)
    try:
        assert job, "the training job was never submitted"
        time.sleep(2)  # the scheduler's first look at it
        held = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True).stdout
    finally:
        if job:
            subprocess.run(["scancel", job], check=False)
        out, _ = proc.communicate(timeout=360)
    assert "NumNodes=4-4 " in held and "TresPerNode=gres:gpu:8" in held and "OverSubscribe=NO" in held, held
    assert "Partition=gpu" in held and "JobState=PENDING" in held and "NumTasks=4" in held, held
    assert "TimeLimit=3-00:00:00" in held and "MinMemoryNode=400000M" in held, held
    call = re.search(r"sbatch call: (sbatch [^\n]+)", out)
    assert call, out[-3000:]
    opts = call.group(1)
    for opt in (
        "--nodes=4",
        "--gres=gpu:8",
        "--ntasks=4",
        "--ntasks-per-node=1",
        "--exclusive",
        "--cpus-per-task=16",
    ):
        assert opt in opts, (opt, opts)
    assert "--ntasks-per-gpu" not in opts and "-t 4320" in opts, opts
    assert re.search(rf"SLURM-job '{job}' failed, SLURM status is: 'CANCELLED", out), out[-3000:]


# --------------------------------------------------------------------------------------- verl on Ray


def test_verl_launch_brings_up_one_ray_cluster_over_both_nodes(slurm_cluster, tmp_path):
    """verl's launch script (sweflow.train.verl_engine.launch_script) in one 2-node allocation, with only
    $SLURM_JOB_ID left as the plugin leaves it: Ray head on the first node, a worker on the second, then the
    preflight driver: both nodes alive with their GPU, a task ran on each, the composed trainer config asks
    for the same 2 x 1. SWEFLOW_VERL_PREFLIGHT_ONLY=1 stops it there (no GPU for verl's trainer here)."""
    pytest.importorskip("verl")
    pytest.importorskip("ray")
    from sweflow.train.recipe import Parallel, Recipe, check_recipe
    from sweflow.train.verl_engine import launch_script, verl_overrides

    recipe = Recipe(engine="verl", run="ray-check", prompts_per_step=2, samples_per_prompt=2, global_batch=4,
                    total_steps=1, save_every=1, parallel=Parallel(nodes=2, gpus_per_node=1),
                    verl={"ray_port": 6390, "overrides": []})  # fmt: skip
    check_recipe(recipe)
    overrides = verl_overrides(recipe, train_files=str(tmp_path / "t.parquet"), val_files=str(tmp_path / "t.parquet"),
                               model_path=str(tmp_path / "model"), out_dir=str(tmp_path / "out"),
                               agent_loop_config=str(tmp_path / "loops.yaml"))  # fmt: skip
    logs = tmp_path / "logs"
    script = tmp_path / "launch.sh"
    script.write_text(launch_script(recipe, overrides, python=sys.executable, ray_port=6390, log_dir=str(logs),
                                    join_timeout_s=180))  # fmt: skip
    # what the plugin's job environment keeps of Slurm: SLURM_JOB_ID only
    wrapper = tmp_path / "job.sh"
    wrapper.write_text(
        "#!/bin/bash\n"
        'for v in $(env | grep -o "^SLURM_[A-Z_]*" | grep -vx SLURM_JOB_ID); do unset "$v"; done\n'
        f"exec bash {script}\n"
    )
    out = tmp_path / "job.out"
    env = {**snakemake_env(tmp_path), "SWEFLOW_VERL_PREFLIGHT_ONLY": "1"}
    t0 = time.monotonic()
    res = subprocess.run(["sbatch", "--wait", "--parsable", "-p", "gpu", "--nodes=2", "--ntasks=2",
                          "--ntasks-per-node=1", "--gres=gpu:1", "--exclusive", "-t", "5", "-o", str(out),
                          str(wrapper)], capture_output=True, text=True, env=env, timeout=900)  # fmt: skip
    seconds = time.monotonic() - t0
    text = out.read_text() if out.exists() else ""
    assert res.returncode == 0, f"{res.stderr}\n{text[-4000:]}"
    print(f"verl launch to a checked 2-node Ray cluster: {seconds:.0f} s")
    report = json.loads((logs / "preflight.json").read_text())
    assert report["problems"] == [], report
    assert len(report["nodes"]) == 2 and all(n["gpus"] == 1.0 for n in report["nodes"])
    assert len({p["node_id"] for p in report["probes"]}) == 2
    assert report["trainer"]["nnodes"] == 2 and report["trainer"]["n_gpus_per_node"] == 1
    assert report["trainer"]["strategy"] == "megatron"
    assert "stopping before verl's trainer" in text
    assert "ray head n1" in text and (logs / "ray-worker-1.log").exists()


# ------------------------------------------------------------------------------------------------ SFT


def test_train_sft_is_one_two_node_job_training_data_parallel(slurm_cluster, tmp_path):
    """train_sft with sft.train.parallel.nodes 2 (CPU): one 2-node Slurm job, accelerate on each node through
    srun, one data-parallel process per node; the inputs are the recorded Claude Code session (four copies)
    and the tiny model, put where the rule reads them (only train_sft may run)."""
    import gzip

    from sweflow.offline.tiny_model import build_tiny_model
    from sweflow.trajectories.claude_transcripts import read_claude_code, tool_call_row

    work = tmp_path / "work"
    pred = json.loads(gzip.decompress((ROOT / "tests/fixtures/trajectories/claude_code_prediction.json.gz")
                                      .read_bytes()))  # fmt: skip
    row = tool_call_row(read_claude_code(pred))
    messages = work / "results/sample/sft/messages/tools.jsonl"
    messages.parent.mkdir(parents=True)
    messages.write_text("".join(json.dumps({**row, "id": f"{row['id']}-{i}"}) + "\n" for i in range(4)))
    build_tiny_model(work / "models/sweflow--tiny-qwen3-swa/hf")
    overlay = tmp_path / "sft-2n.yaml"
    overlay.write_text(yaml.safe_dump({"sft": {"train": {"run": "tiny-2n", "epochs": 2, "lr": 1e-3,
        "max_length": 32768, "parallel": {"nodes": 2, "gpus_per_node": 0}}}}))  # fmt: skip
    profile = merged_profile(tmp_path / "profile")
    out = "results/sample/sft/train/tiny-2n"
    res = snakemake(work, profile, f"{out}/summary.json", "--configfile", *SLURM_CONFIGS, str(overlay),
                    "--allowed-rules", "train_sft", timeout=900)  # fmt: skip
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    print(f"\n2-node SFT under Slurm: {res.seconds:.0f} s")
    rec = json.loads((work / ".provenance" / f"{out}/summary.json.json").read_text())
    assert rec["slurm"]["nodes"] == slurm_cluster["nodes"][:2] and rec["slurm"]["partition"] == "gpu"
    summary = json.loads((work / out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["launch"]["nodes"] == rec["slurm"]["nodes"]
    assert summary["kept"] == 4 and summary["loss_last"] < summary["loss_first"], summary
    # 4 rows, one per process per step: 2 steps an epoch
    metrics = [json.loads(x) for x in (work / out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4] == list(range(1, summary["steps"] + 1))
    for r in (0, 1):
        assert (work / out / "work" / "logs" / f"sft-rank-{r}.log").exists()
    job = subprocess.run(["scontrol", "show", "job", "-o", rec["slurm"]["job_id"]], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert "NumNodes=2 " in job and "NumTasks=2 " in job and "JobState=COMPLETED" in job, job
