"""Build the embedded sample repository `sweflow/calclib` as a real git repository with a fixed history.

The history is stored as overlay folders under `repo_files/` (one per commit, applied in order). Author,
committer, dates and git configuration are pinned, so the commit shas are the same on every machine.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from sweflow.errors import DatasetError
from sweflow.util import run_cmd

REPO_NAME = "sweflow/calclib"
FILES_DIR = Path(__file__).parent / "repo_files"


@dataclass(frozen=True)
class CommitSpec:
    name: str
    folder: str
    message: str
    date: str


# Named commits of the sample history, oldest first.
HISTORY: tuple[CommitSpec, ...] = (
    CommitSpec("initial", "01-initial", "Initial commit: tokenizer and parser", "2024-01-10T09:00:00+00:00"),
    CommitSpec(
        "evaluator", "02-evaluator", "Add evaluator and calc() entry point", "2024-02-05T14:30:00+00:00"
    ),
    CommitSpec(
        "units_stats",
        "03-units-stats",
        "Add unit conversion and statistics helpers",
        "2024-03-12T11:15:00+00:00",
    ),
    CommitSpec("docs", "04-docs", "Document usage in the README; release 0.1.1", "2024-04-02T16:45:00+00:00"),
)

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "Calclib Maintainers",
    "GIT_AUTHOR_EMAIL": "maintainers@calclib.invalid",
    "GIT_COMMITTER_NAME": "Calclib Maintainers",
    "GIT_COMMITTER_EMAIL": "maintainers@calclib.invalid",
}

# `-c` options for every git call: no user/system config, hooks, signing or line-ending rewriting.
GIT_OPTIONS = [
    "-c",
    "init.defaultBranch=main",
    "-c",
    "commit.gpgsign=false",
    "-c",
    "tag.gpgsign=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.autocrlf=false",
    "-c",
    "core.fileMode=true",
]


@dataclass(frozen=True)
class RepoInfo:
    """A materialised sample repository: its path, head sha and the sha of every named commit."""

    path: Path
    head: str
    commits: dict[str, str] = field(default_factory=dict)


def git_env(date: str | None = None) -> dict[str, str]:
    """Environment for git: isolated from user/system config, fixed identity and (optionally) dates."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "LC_ALL": "C",
        "TZ": "UTC",
        **GIT_IDENTITY,
    }
    if date:
        env["GIT_AUTHOR_DATE"] = date
        env["GIT_COMMITTER_DATE"] = date
    return env


def git(
    repo: Path, *args: str, date: str | None = None, input: str | None = None, timeout: float = 60
) -> str:
    """Run one git command in `repo` with the pinned environment; return stdout or raise DatasetError."""
    res = run_cmd(["git", *GIT_OPTIONS, *args], cwd=repo, env=git_env(date), input=input, timeout=timeout)
    if res.returncode != 0:
        raise DatasetError(
            f"git {' '.join(args[:2])} failed (exit {res.returncode}): {res.stderr.strip()[:300]}",
            file=str(repo),
        )
    return res.stdout


# Every stored file carries an extra `.txt` suffix (so it ships as package data and no tool mistakes it for
# project code); `dot-<name>` stands for `.<name>`.
def stored_to_repo_path(rel: str) -> str:
    """Map a stored path (`a/dot-gitignore.txt`) to its path in the repository (`a/.gitignore`)."""
    if not rel.endswith(".txt"):
        raise DatasetError("stored sample file lacks the .txt suffix", file=rel)
    parts = rel[: -len(".txt")].split("/")
    parts = ["." + p[len("dot-") :] if p.startswith("dot-") else p for p in parts]
    return "/".join(parts)


def layer_files(folder: str) -> dict[str, bytes]:
    """The files one commit adds or replaces: repository path -> bytes."""
    base = FILES_DIR / folder
    if not base.is_dir():
        raise DatasetError("sample history folder is missing", file=str(base))
    out = {}
    for f in sorted(p for p in base.rglob("*") if p.is_file()):
        out[stored_to_repo_path(f.relative_to(base).as_posix())] = f.read_bytes()
    return out


def _write_tree(repo: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        target = repo / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        os.chmod(target, 0o644)


def materialize_repo(dest: Path) -> RepoInfo:
    """Create the sample git repository at `dest` (absent or empty) with its fixed history; branch `main`.

    The shas depend only on the stored files, never on the machine, user or clock.
    """
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise DatasetError("destination for the sample repository is not empty", file=str(dest))
    dest.mkdir(parents=True, exist_ok=True)
    git(dest, "init", "-q", "--template=")
    commits: dict[str, str] = {}
    for spec in HISTORY:
        _write_tree(dest, layer_files(spec.folder))
        git(dest, "add", "-A")
        git(dest, "commit", "-q", "--no-verify", "-m", spec.message, date=spec.date)
        commits[spec.name] = git(dest, "rev-parse", "HEAD").strip()
    return RepoInfo(path=dest, head=commits[HISTORY[-1].name], commits=commits)


def clone_at(src: Path, dest: Path, commit: str) -> Path:
    """A working copy of the repository at `src` with `commit` checked out (detached); cheap local clone."""
    if shutil.which("git") is None:
        raise DatasetError("git is not installed", hint="install git")
    git(Path(dest).parent, "clone", "-q", "--no-checkout", str(src), str(dest))
    git(Path(dest), "checkout", "-q", "--detach", commit)
    return Path(dest)


def apply_patch(repo: Path, patch: str, *, check_only: bool = False) -> bool:
    """`git apply` a unified diff in `repo`; return False (nothing changed) when it does not apply."""
    if not patch:
        return True
    args = ["git", *GIT_OPTIONS, "apply", "--whitespace=nowarn"] + (["--check"] if check_only else []) + ["-"]
    return run_cmd(args, cwd=repo, env=git_env(), input=patch, timeout=60).returncode == 0
