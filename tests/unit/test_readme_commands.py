"""Every command of the fenced bash blocks of README.md and docs/*.md runs as written (issue 45, point 8: a
target after `--configfile` was read as a second config file). Each snakemake command is parsed with
Snakemake's own parser; those that can run offline are dry-run; the others are skipped with the reason."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
SHELL_LANGS = {"bash", "sh", "shell", "console"}
# Files a command names that the user writes (README, "Using it for real"); the stand-in has their shape.
USER_FILES = {"site.yaml": ROOT / "tests" / "fixtures" / "site.yaml"}
# Commands that are not snakemake runs, by their first word(s): why the test does not run them.
NOT_RUN = {
    "make run": "sets up the machine (apt with sudo, a Docker engine) and runs the whole pipeline",
    "make test": "runs the whole test suite",
    "make slurm-profile": "writes the user's Slurm profile into ~/.config/snakemake",
    "xargs": "pulls task images from Docker Hub: needs the network",
    "sweflow audit": "reads a finished run's artifacts",
    "sweflow verify": "reads a finished run's artifacts",
}


def doc_commands() -> list[tuple[str, str]]:
    """(where, command) of every command line of a fenced shell block, continuation lines joined."""
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(1) not in SHELL_LANGS:
                continue
            first = text.count("\n", 0, m.start(2)) + 1
            pending, start = "", 0
            for n, line in enumerate(m.group(2).splitlines(), first):
                if not pending:
                    start = n
                pending += line
                if pending.endswith("\\"):
                    pending = pending[:-1] + " "
                    continue
                words = shlex.split(pending, comments=True)
                if words:
                    out.append((f"{doc.relative_to(ROOT)}:{start}", pending.strip()))
                pending = ""
    return out


COMMANDS = doc_commands()


def argv(command: str) -> list[str]:
    """The words of a command, without leading VAR=value assignments."""
    words = shlex.split(command, comments=True)
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words.pop(0)
    return words


def is_snakemake(words: list[str]) -> bool:
    return bool(words) and Path(words[0]).name == "snakemake"


SNAKEMAKE = [(w, c) for w, c in COMMANDS if is_snakemake(argv(c))]


OTHERS = [(w, c) for w, c in COMMANDS if not is_snakemake(argv(c))]


def test_the_docs_have_snakemake_commands_to_check():
    assert len(SNAKEMAKE) >= 4, SNAKEMAKE


@pytest.mark.parametrize(("where", "command"), OTHERS, ids=[w for w, _ in OTHERS])
def test_every_other_command_is_skipped_with_its_reason(where, command):
    reasons = [why for start, why in NOT_RUN.items() if " ".join(argv(command)).startswith(start)]
    assert reasons, f"{where}: a new command in the docs: run it here, or say in NOT_RUN why not: {command}"
    pytest.skip(f"{where}: {reasons[0]}")


@pytest.mark.parametrize(("where", "command"), SNAKEMAKE, ids=[w for w, _ in SNAKEMAKE])
def test_snakemake_reads_every_config_file_as_one_and_no_target_as_one(where, command):
    from snakemake.cli import get_argument_parser

    args = get_argument_parser().parse_args(argv(command)[1:])
    for cfg in args.configfile or []:
        path = USER_FILES.get(str(cfg), ROOT / cfg)
        assert cfg.suffix in {".yaml", ".yml", ".json"} and path.is_file(), (
            f"{where}: snakemake reads {str(cfg)!r} as a config file: put targets before --configfile"
        )
    for target in args.targets:
        assert not str(target).endswith((".yaml", ".yml")), f"{where}: a config file read as a target"


def offline_reason(words: list[str]) -> str | None:
    """Why a snakemake command cannot be dry-run here (None: it can)."""
    from snakemake.cli import get_argument_parser

    args = get_argument_parser().parse_args(words[1:])
    for profile in args.profile or []:
        if not (ROOT / profile).is_dir():
            return f"needs the user's profile {profile!r} (make slurm-profile), conda and a Slurm cluster"
        if "slurm" in profile:
            return "needs conda and a Slurm cluster"
    return None


def dry_run_argv(words: list[str]) -> list[str]:
    """The command for a dry run in another folder: repo paths made absolute, no workflow profile, -n."""
    out, after_profile = [sys.executable, "-m", "snakemake"], False
    for w in words[1:]:
        if (after_profile or w.endswith((".yaml", ".yml"))) and (ROOT / w).exists():
            w = str(ROOT / w)
        after_profile = w == "--profile"
        out.append(w)
    return [*out, "--snakefile", str(ROOT / "Snakefile"), "--workflow-profile", "none", "-n"]


@pytest.mark.parametrize(("where", "command"), SNAKEMAKE, ids=[w for w, _ in SNAKEMAKE])
def test_the_offline_snakemake_commands_dry_run_as_written(where, command, tmp_path):
    words = argv(command)
    reason = offline_reason(words)
    if reason:
        pytest.skip(f"{where}: {reason}")
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / ".hf"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    # the README installs the config's harness package first (pip install -r envs/harness.txt); before any
    # job the workflow only checks that it is importable, so an empty stand-in does for a dry run
    import yaml

    for cfg in [w for w in words if w.endswith((".yaml", ".yml")) and (ROOT / w).is_file()]:
        package = ((yaml.safe_load((ROOT / cfg).read_text()) or {}).get("harness") or {}).get("package")
        # asked of a fresh interpreter: other tests put fixture harnesses on this process's sys.path
        probe = [
            sys.executable,
            "-c",
            f"import importlib.util as u, sys; sys.exit(u.find_spec({package!r}) is None)",
        ]
        if package and subprocess.run(probe, env=env, capture_output=True, timeout=60).returncode != 0:
            (tmp_path / "stand-ins" / package).mkdir(parents=True, exist_ok=True)
            (tmp_path / "stand-ins" / package / "__init__.py").write_text("")
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(tmp_path / "stand-ins"), env.get("PYTHONPATH")])
            )
    work = tmp_path / "work"
    work.mkdir()
    res = subprocess.run(dry_run_argv(words), capture_output=True, text=True, env=env, cwd=work, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "Traceback" not in out, f"{where}: {command}\n{out[-3000:]}"
    assert "This was a dry-run" in out or "Nothing to be done" in out, out[-3000:]
