"""The before-agent git sanitizer on a real repository whose history contains the fix."""

from __future__ import annotations

import subprocess

import pytest

from sweflow.sanitizer import SANITIZER_OK, sanitizer_command

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "HOME": "/nonexistent",
    "PATH": "/usr/bin:/bin",
}


def git(repo, *args):
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=GIT_ENV
    ).stdout.strip()


@pytest.fixture
def leaky_repo(tmp_path):
    """base commit, then a 'fix' commit on main, a tag, a stash, a remote, a branch and notes pointing at it."""
    repo = tmp_path / "testbed"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "m.py").write_text("def f():\n    return 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "m.py").write_text("def f():\n    return 2  # THE FIX\n")
    git(repo, "commit", "-qam", "fix the bug")
    fix = git(repo, "rev-parse", "HEAD")
    git(repo, "tag", "v-fixed")
    git(repo, "branch", "feature")
    git(repo, "notes", "add", "-m", "note")
    git(repo, "remote", "add", "origin", "https://example.invalid/repo.git")
    git(repo, "update-ref", "refs/remotes/origin/main", fix)
    (repo / "m.py").write_text("dirty\n")
    git(repo, "stash", "-q")
    (repo / "untracked.txt").write_text("x")
    return repo, base, fix


def test_sanitizer_leaves_only_the_base(leaky_repo):
    repo, base, fix = leaky_repo
    res = subprocess.run(
        sanitizer_command(base, str(repo)), shell=True, capture_output=True, text=True, env=GIT_ENV
    )
    assert res.returncode == 0, res.stderr
    assert SANITIZER_OK in res.stdout
    assert git(repo, "rev-parse", "HEAD") == base
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "for-each-ref") == ""
    assert git(repo, "remote") == ""
    assert git(repo, "reflog") == ""
    assert set(git(repo, "rev-list", "--all").split()) == {base}
    # the fix commit object itself is gone
    probe = subprocess.run(["git", "-C", str(repo), "cat-file", "-e", fix], capture_output=True)
    assert probe.returncode != 0


def test_sanitizer_fails_on_unknown_base(leaky_repo):
    repo, _, _ = leaky_repo
    res = subprocess.run(
        sanitizer_command("f" * 40, str(repo)), shell=True, capture_output=True, text=True, env=GIT_ENV
    )
    assert res.returncode == 3 and "not found" in res.stderr
