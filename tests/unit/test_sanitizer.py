"""The before-agent git sanitizer on real repositories whose history contains the fix: plain, owned by another
uid, shallow clones, with submodules, with linked worktrees."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from sweflow.dataset.sanitizer import SANITIZER_OK, sanitizer_command

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "HOME": "/nonexistent",
    "PATH": "/usr/bin:/bin",
}


def git(repo, *args):
    # the test's own reads trust every folder (some repos here belong to another uid); the sanitizer gets no -c
    return subprocess.run(
        ["git", "-c", "safe.directory=*", "-c", "protocol.file.allow=always", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
        env=GIT_ENV,
    ).stdout.strip()


def sanitize(repo, base, *, user: int | None = None, tmpdir: Path | None = None):
    cmd = sanitizer_command(base, str(repo))
    if user is not None:
        cmd = f"setpriv --reuid={user} --regid={user} --clear-groups {cmd}"
    env = {**GIT_ENV, **({"TMPDIR": str(tmpdir)} if tmpdir is not None else {})}
    # cwd: the repository, which the other uid can reach (a checkout under a 0700 folder it cannot)
    return subprocess.run(cmd, shell=True, capture_output=True, text=True, env=env, cwd=repo)


def commit(repo, name, text, msg):
    (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", msg)
    return git(repo, "rev-parse", "HEAD")


def assert_only_base(repo, base, *gone):
    """HEAD at the base, clean, and nothing newer than the base reachable (`git log --all`) or stored."""
    assert git(repo, "rev-parse", "HEAD") == base
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "for-each-ref") == "" and git(repo, "remote") == ""
    assert set(git(repo, "log", "--all", "--format=%H").split()) == set(git(repo, "rev-list", base).split())
    git(repo, "fsck", "--no-dangling")  # a consistent repository: no broken ref, no missing object
    for obj in gone:
        probe = subprocess.run(
            ["git", "-c", "safe.directory=*", "-C", str(repo), "cat-file", "-e", obj], capture_output=True
        )
        assert probe.returncode != 0, f"{obj} is still in {repo}"


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


@pytest.fixture
def world_dir():
    """A folder every uid can reach (pytest's tmp_path is 0700 root)."""
    d = Path(tempfile.mkdtemp(prefix="sweflow-sanitizer-test-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _leaky_repo_in(root):
    repo = root / "testbed"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    base = commit(repo, "m.py", "def f():\n    return 1\n", "base")
    fix = commit(repo, "m.py", "def f():\n    return 2  # THE FIX\n", "fix the bug")
    git(repo, "tag", "v-fixed")
    git(repo, "branch", "feature")
    git(repo, "reset", "-q", "--hard", base)
    return repo, base, fix


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@needs_root
def test_repository_owned_by_another_uid_is_sanitized_as_root(world_dir):
    repo, base, fix = _leaky_repo_in(world_dir)
    subprocess.run(["chown", "-R", "65534:65534", str(repo)], check=True)
    # plain git as root refuses it: the situation the sanitizer must handle
    plain = subprocess.run(["git", "-C", str(repo), "status"], capture_output=True, text=True, env=GIT_ENV)
    assert plain.returncode != 0 and "dubious ownership" in plain.stderr
    # a temp folder of this run's own (other sanitizer runs may share /tmp under xdist)
    tmp = world_dir / "tmp"
    tmp.mkdir()
    res = sanitize(repo, base, tmpdir=tmp)
    assert res.returncode == 0, res.stderr
    assert SANITIZER_OK in res.stdout
    assert_only_base(repo, base, fix)
    # nothing was written to a global config: the trust lived in a temp folder that is gone
    assert not list(tmp.glob("sweflow-sanitizer.*"))


@needs_root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv is not installed")
def test_repository_owned_by_another_uid_is_sanitized_as_a_third_uid(world_dir):
    repo, base, fix = _leaky_repo_in(world_dir)
    subprocess.run(["chown", "-R", "65534:65534", str(repo)], check=True)
    subprocess.run(["chmod", "-R", "a+rwX", str(repo)], check=True)
    res = sanitize(repo, base, user=12345)
    assert res.returncode == 0, res.stderr
    assert_only_base(repo, base, fix)


@pytest.mark.parametrize("how", ["depth-1-base-only", "depth-2-fix-on-top"])
def test_shallow_clone_keeps_the_base_and_loses_the_fix(tmp_path, how):
    origin = tmp_path / "origin"
    origin.mkdir()
    git(origin, "init", "-q", "-b", "main")
    first = commit(origin, "m.py", "v0\n", "first")
    base = commit(origin, "m.py", "v1\n", "base")
    git(origin, "tag", "base")
    fix = commit(origin, "m.py", "v2 THE FIX\n", "fix")
    clone = tmp_path / "testbed"
    if how == "depth-1-base-only":
        git(tmp_path, "clone", "-q", "--depth", "1", "--branch", "base", f"file://{origin}", str(clone))
        git(
            clone, "fetch", "-q", "--depth", "1", "origin", "main:refs/remotes/origin/main"
        )  # the fix, shallow too
    else:
        git(tmp_path, "clone", "-q", "--depth", "2", f"file://{origin}", str(clone))
        git(clone, "checkout", "-q", "--detach", base)
    assert (clone / ".git" / "shallow").exists() and git(clone, "cat-file", "-t", fix) == "commit"
    res = sanitize(clone, base)
    assert res.returncode == 0, res.stderr
    assert_only_base(clone, base, fix)
    assert git(clone, "rev-parse", "--is-shallow-repository") == "true"
    assert git(clone, "log", "--format=%H") == base  # history beyond the base is absent, and git still works
    subprocess.run(["git", "-C", str(clone), "fsck", "--no-dangling"], check=True, capture_output=True)
    assert first not in git(clone, "log", "--all", "--format=%H")


def test_submodules_are_reset_to_the_recorded_commit_and_sanitized(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    git(lib, "init", "-q", "-b", "main")
    lib_base = commit(lib, "lib.py", "X = 1\n", "lib base")
    lib_fix = commit(lib, "lib.py", "X = 2  # THE LIB FIX\n", "lib fix")
    extra = tmp_path / "extra"
    extra.mkdir()
    git(extra, "init", "-q", "-b", "main")
    extra_commit = commit(extra, "e.py", "E = 1\n", "extra")

    repo = tmp_path / "testbed"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit(repo, "m.py", "v1\n", "start")
    git(repo, "submodule", "add", "-q", f"file://{lib}", "lib")
    git(repo / "lib", "checkout", "-q", lib_base)
    base = commit(repo, "m.py", "v1 with lib at base\n", "base")
    git(repo / "lib", "checkout", "-q", lib_fix)
    git(repo, "submodule", "add", "-q", f"file://{extra}", "extra")  # a submodule only the future has
    fix = commit(repo, "m.py", "v2 THE FIX\n", "fix: bump lib, add extra")
    git(repo / "lib", "tag", "lib-v2")

    res = sanitize(repo, base)
    assert res.returncode == 0, res.stderr
    assert_only_base(repo, base, fix)
    assert git(repo / "lib", "rev-parse", "HEAD") == lib_base
    assert_only_base(repo / "lib", lib_base, lib_fix)
    assert (repo / "lib" / "lib.py").read_text() == "X = 1\n"
    # the future-only submodule: neither its checkout nor its store is left
    assert not (repo / "extra").exists() and not (repo / ".git" / "modules" / "extra").exists()
    assert (repo / ".git" / "modules" / "lib").is_dir()
    assert (
        extra_commit
        not in subprocess.run(["grep", "-r", extra_commit, str(repo)], capture_output=True, text=True).stdout
    )


def test_linked_worktrees_are_removed_with_their_commits(tmp_path):
    repo = tmp_path / "testbed"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    base = commit(repo, "m.py", "v1\n", "base")
    git(repo, "branch", "feature")
    outside, inside = tmp_path / "wt-feature", repo / "wt-detached"
    git(repo, "worktree", "add", "-q", str(outside), "feature")
    fix = commit(outside, "m.py", "v2 THE FIX\n", "fix on feature")
    git(repo, "worktree", "add", "-q", "--detach", str(inside), fix)
    git(repo, "worktree", "lock", str(inside))
    (outside / "scratch.txt").write_text("uncommitted work in the worktree")
    gone = tmp_path / "wt-vanished"
    git(repo, "worktree", "add", "-q", "--detach", str(gone), fix)
    shutil.rmtree(gone)  # a worktree whose folder no longer exists: only its admin files are left

    res = sanitize(repo, base)
    assert res.returncode == 0, res.stderr
    assert_only_base(repo, base, fix)
    assert not outside.exists() and not inside.exists()
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert not (repo / ".git" / "worktrees").exists()


def test_a_linked_worktree_as_workdir_is_refused(tmp_path):
    repo = tmp_path / "main"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    base = commit(repo, "m.py", "v1\n", "base")
    wt = tmp_path / "testbed"
    git(repo, "worktree", "add", "-q", "--detach", str(wt), base)
    res = sanitize(wt, base)
    assert res.returncode == 10 and "linked worktree" in res.stderr
