"""Fixtures shared by integration modules: the embedded default run with the local profile (the training
tests read it; the Slurm test compares its own run with it) and a real one-machine Slurm (.ci/slurm.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


# Every embedded run has this key in its environment, as a user's shell would: the SFT branch's expert
# endpoint (scripted there) demands it, and no artifact, log or record may contain it (test_sft_pipeline.py).
PLANTED_API_KEY = "sk-ant-api03-PLANTED-embedded-run-7d3f9a1c5e2b4d6f8a0c"


def snakemake_env(work: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ANTHROPIC_API_KEY": PLANTED_API_KEY,
        "HF_HOME": str(work / ".hf"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }


# The embedded default with GRPO as 2 data-parallel processes (tests/fixtures/two_nodes.yaml): the local
# run and the Slurm run (one 2-node job) train the same way, so their outputs can be compared byte for byte.
EMBEDDED_CONFIGS = [str(ROOT / "config" / "config.yaml"), str(ROOT / "tests" / "fixtures" / "two_nodes.yaml")]


@pytest.fixture(scope="session")
def embedded_local_run(tmp_path_factory):
    """`make run`'s pipeline (the embedded default, every stage; EMBEDDED_CONFIGS) with profiles/local, in a
    fresh folder: built once per test session, under xdist too (the first worker to ask builds it under a
    file lock in the folder the workers share; the others wait and read it)."""
    if not shutil.which("claude") or not shutil.which("bwrap"):
        pytest.skip("needs Claude Code and bubblewrap (.ci/system.sh)")
    pytest.importorskip("trl")
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return _build_embedded_run(tmp_path_factory.mktemp("embedded-local"))
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent  # one per session, beside each worker's own
    work, failed = shared / "embedded-local", shared / "embedded-local.failed"
    with FileLock(str(shared / "embedded-local.lock")):
        if failed.exists():
            pytest.fail(f"the embedded run failed in another worker:\n{failed.read_text()}")
        if not (shared / "embedded-local.done").exists():
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            try:
                _build_embedded_run(work)
            except BaseException as exc:
                failed.write_text(str(exc)[-10000:])
                raise
            (shared / "embedded-local.done").write_text("ok\n")
    return work


def _build_embedded_run(work: Path) -> Path:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(work),
           "--profile", str(ROOT / "profiles" / "local"), "--workflow-profile", "none",
           "--configfile", *EMBEDDED_CONFIGS]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=snakemake_env(work), timeout=2200)
    assert res.returncode == 0, f"snakemake failed:\n{res.stdout[-4000:]}\n{res.stderr[-6000:]}"
    return work


# ------------------------------------------------------------------------------------------------ Slurm

SLURM_SCRIPT = ROOT / ".ci" / "slurm.sh"
OVERLAY = ROOT / "tests" / "slurm_profile" / "config.yaml"


def slurm_running() -> bool:
    if not shutil.which("sinfo"):
        return False
    res = subprocess.run(["sinfo", "-h", "-o", "%N"], capture_output=True, text=True, timeout=30)
    return res.returncode == 0 and bool(res.stdout.strip())


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real Slurm on this machine (one controller, two slurmd nodes with a fake GPU each, partitions cpu
    and gpu): used as it is when one is up, else brought up by .ci/slurm.sh and torn down afterwards."""
    started, sudo = False, []
    if not slurm_running():
        sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
        if sudo and (not shutil.which("sudo") or subprocess.run([*sudo, "true"]).returncode != 0):
            pytest.skip("bringing up Slurm needs root or password-less sudo (.ci/slurm.sh)")
        res = subprocess.run(
            [*sudo, "bash", str(SLURM_SCRIPT), "up"], capture_output=True, text=True, timeout=600
        )
        assert res.returncode == 0, f".ci/slurm.sh up failed:\n{res.stdout}\n{res.stderr}"
        print(res.stdout.splitlines()[0] if res.stdout else "")
        started = True
    listed = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True).stdout.split()
    yield {"nodes": sorted(set(listed))}  # sinfo lists a node once per partition
    if started:
        subprocess.run(
            [*sudo, "bash", str(SLURM_SCRIPT), "down"], capture_output=True, text=True, timeout=120
        )


def merged_profile(dest: Path, extra: dict | None = None) -> Path:
    """profiles/slurm with the test overlay (tests/slurm_profile/config.yaml) merged over it: its `drop`
    keys removed, its mappings merged one level deep (set-resources per rule: two), the rest replaced."""
    base = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    overlay = yaml.safe_load(OVERLAY.read_text())
    for layer in (overlay, extra or {}):
        layer = dict(layer)
        for key in layer.pop("drop", []):
            base.pop(key, None)
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                for k, v in value.items():
                    if isinstance(v, dict) and isinstance(base[key].get(k), dict):
                        base[key][k] = {**base[key][k], **v}
                    else:
                        base[key][k] = v
            else:
                base[key] = value
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.yaml").write_text(yaml.safe_dump(base, sort_keys=True))
    return dest
