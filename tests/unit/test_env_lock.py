"""The production env (envs/train-verl.*) installs: a lock compiled for the target (Python 3.12, Linux x86_64)
from which the conda env and the Dockerfile install, re-resolved here against the package index with uv.

The offline tests check the files agree (pins, the lock's hash in the post-deploy script, the git packages'
declared requirements); the `network` tests ask the index: every pin exists for the target and the set is
consistent; the stop-41 pins (one pip command) fail; megatron-bridge's own requirements that the lock leaves
unmet are exactly the ones train-verl.nodeps.txt names, each with its reason.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from sweflow.envlock import TARGET_PLATFORM, TARGET_PYTHON, read_pins, unmet, wheel_requires

ROOT = Path(__file__).resolve().parents[2]
ENVS = ROOT / "envs"
LOCK = ENVS / "train-verl.lock.txt"
UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")


def nodeps() -> dict[str, Version]:
    return read_pins(ENVS / "train-verl.nodeps.txt")


def documented_unmet() -> set[str]:
    text = (ENVS / "train-verl.nodeps.txt").read_text()
    return {canonicalize_name(n) for n in re.findall(r"^#\s+unmet: (\S+)", text, re.M)}


def test_conda_env_and_dockerfile_install_from_the_lock():
    deps = yaml.safe_load((ENVS / "train-verl.yaml").read_text())["dependencies"]
    assert "python=3.12" in deps
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    assert [x.split("#")[0].strip() for x in pip] == ["-r train-verl.lock.txt", "-r harness.txt"]
    docker = (ENVS / "train-verl.Dockerfile").read_text()
    assert "pip install -r envs/train-verl.lock.txt -r /tmp/harness.txt" in docker
    assert "RUN bash envs/train-verl.post-deploy.sh" in docker
    # no version is pinned outside the lock, the --no-deps stage and the source builds of the script
    assert not re.search(r"==\d", docker)


def test_the_post_deploy_script_names_the_lock_it_was_written_for():
    """Snakemake hashes the env file and this script, not the lock: the lock's hash in the script makes a
    changed lock a new env (and the script refuses another lock)."""
    script = (ENVS / "train-verl.post-deploy.sh").read_text()
    recorded = re.search(r"^LOCK_SHA256=([0-9a-f]{64})$", script, re.M).group(1)
    assert recorded == hashlib.sha256(LOCK.read_bytes()).hexdigest()
    assert "pip install --no-deps -r" in script and "train-verl.nodeps.txt" in script


def test_the_lock_holds_every_top_level_pin_and_nothing_of_stage_two():
    lock, top = read_pins(LOCK), read_pins(ENVS / "train-verl.in")
    assert len(lock) > 300
    assert {n: v for n, v in top.items() if lock.get(n) != v} == {}
    assert set(nodeps()) == {"megatron-bridge"} and not set(nodeps()) & set(lock)
    # no package only git provides: the lock is for the index
    assert "git+" not in LOCK.read_text()


def test_git_packages_declared_requirements_are_in_the_lock():
    harness = (ENVS / "harness.txt").read_text()
    lock = read_pins(LOCK)
    for line in (ENVS / "git-requires.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        head, reqs = line.split(":", 1)
        name, rev = (x.strip() for x in head.split("@"))
        assert re.search(rf"^{name} @ git\+\S+@{rev}$", harness, re.M), f"{name}: another revision is pinned"
        assert unmet(reqs.split(), lock) == [], name


# ----------------------------------------------------------------------------------------- the index


network = pytest.mark.skipif(UV is None, reason="uv is not installed (pyproject's test extra)")


def uv_compile(requirements: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    out = tmp_path / "out.txt"
    cmd = [UV, "pip", "compile", str(requirements), "--python-version", TARGET_PYTHON]
    cmd += ["--python-platform", TARGET_PLATFORM, "--no-header", "--no-annotate", "-o", str(out)]
    # uv would fetch a standalone Python for the target if none is found: use the resolver's own markers
    # (and a cold cache, as CI has); the machine's certificate settings stay
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    proc.pins = read_pins(out) if out.exists() else {}  # type: ignore[attr-defined]
    return proc


@network
@pytest.mark.slow
def test_the_lock_re_resolves_on_the_index_to_itself(tmp_path):
    """Every pin exists on the index for the target, and the pins are one consistent resolution: compiled
    again, the lock gives back exactly its own versions."""
    proc = uv_compile(LOCK, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.pins == read_pins(LOCK)
    print(f"lock: {len(proc.pins)} packages, sha256 {hashlib.sha256(LOCK.read_bytes()).hexdigest()}")


@network
@pytest.mark.slow
def test_the_stop_41_pins_do_not_resolve(tmp_path):
    """What the check catches: the env as it was (one pip command) is unsatisfiable on the index."""
    proc = uv_compile(ROOT / "tests" / "fixtures" / "envs" / "train-verl-stop41.txt", tmp_path)
    assert proc.returncode != 0
    assert "flashinfer" in proc.stderr and "unsatisfiable" in proc.stderr


def download_wheel(spec: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    cmd += [
        "--python-version",
        TARGET_PYTHON,
        "--platform",
        "manylinux_2_28_x86_64",
        "--platform",
        "any",
        spec,
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    name = canonicalize_name(Requirement(spec).name).replace("-", "_")
    return next(
        p for p in dest.glob("*.whl") if canonicalize_name(p.name.split("-")[0]).replace("-", "_") == name
    )


@network
@pytest.mark.slow
def test_stage_two_leaves_unmet_only_the_named_requirements(tmp_path):
    lock = read_pins(LOCK)

    def requires_of(name: str, version: Version) -> list[str]:
        return wheel_requires(download_wheel(f"{name}=={version}", tmp_path / name))

    for name, version in nodeps().items():
        found = unmet(requires_of(name, version), lock, requires_of=requires_of)
        names = {canonicalize_name(Requirement(r).name) for r, _ in found}
        assert names == documented_unmet(), found
