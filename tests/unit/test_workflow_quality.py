"""House quality gates as tests, so CI enforces them: ruff, snakefmt and `snakemake --lint` are clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CODE = ["sweflow", "tests", "scripts", "benchmarks"]


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "cmd",
    [
        [str(BIN / "ruff"), "check", *CODE],
        [str(BIN / "ruff"), "format", "--check", *CODE],
        [str(BIN / "snakefmt"), "--check", "Snakefile", "rules"],
    ],
    ids=["ruff-check", "ruff-format", "snakefmt"],
)
def test_code_is_lint_clean(cmd):
    if not Path(cmd[0]).exists():
        pytest.skip(f"{Path(cmd[0]).name} is not installed")
    res = run(*cmd)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def test_snakemake_lint_is_clean():
    res = run(sys.executable, "-m", "snakemake", "--lint", "--workflow-profile", "none")
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "Congratulations" in out, out[-3000:]
