"""The local Hub's store: versioned dataset and model repositories on disk, with git-like commits.

Every commit is an immutable set of files whose 40-hex sha is derived from its content, message and parent
(so the same publishes give the same shas everywhere); branches and tags point at commits. Layout of `root/`:
`objects/<sha256>` (file contents), `<type>s/<repo_id>/commits/<sha>.json`, `<type>s/<repo_id>/refs.json`.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sweflow.errors import DatasetError
from sweflow.util import atomic_write, atomic_write_json, read_json, sha256_bytes, stable_json

REPO_TYPES = ("dataset", "model")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?\Z")
_FULL_SHA = re.compile(r"^[0-9a-f]{40}\Z")


class RepoNotFoundError(DatasetError):
    """The repository does not exist in the store."""


class RevisionNotFoundError(DatasetError):
    """The repository exists but the branch, tag or commit does not."""


class EntryNotFoundError(DatasetError):
    """The commit exists but has no such file."""


def _check_path(name: str) -> str:
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise DatasetError(f"invalid file path {name!r} for a hub repository")
    return name


class HubStore:
    """Versioned repositories on disk (see the module docstring). Safe for one writer and many readers."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()

    # ---- layout -------------------------------------------------------------------------------------
    def _repo_dir(self, repo_id: str, repo_type: str) -> Path:
        if repo_type not in REPO_TYPES:
            raise DatasetError(f"unknown repo type {repo_type!r}", hint=f"use one of {list(REPO_TYPES)}")
        if not _REPO_ID.match(repo_id) or ".." in repo_id:
            raise RepoNotFoundError(f"invalid repository id {repo_id!r}")
        return self.root / f"{repo_type}s" / repo_id

    def exists(self, repo_id: str, repo_type: str = "dataset") -> bool:
        try:
            return (self._repo_dir(repo_id, repo_type) / "refs.json").is_file()
        except RepoNotFoundError:
            return False

    def refs(self, repo_id: str, repo_type: str = "dataset") -> dict[str, dict[str, str]]:
        """{"branches": {name: sha}, "tags": {name: sha}}; RepoNotFoundError for an unknown repo."""
        path = self._repo_dir(repo_id, repo_type) / "refs.json"
        if not path.is_file():
            raise RepoNotFoundError(f"repository {repo_id!r} not found", file=str(self.root))
        return read_json(path)

    def commit(self, repo_id: str, sha: str, repo_type: str = "dataset") -> dict[str, Any]:
        """The stored commit record: {"parent", "message", "files": {path: {"sha256", "size"}}}."""
        path = self._repo_dir(repo_id, repo_type) / "commits" / f"{sha}.json"
        if not _FULL_SHA.match(sha) or not path.is_file():
            raise RevisionNotFoundError(f"commit {sha!r} not found in {repo_id!r}")
        return read_json(path)

    def resolve(self, repo_id: str, rev: str = "main", repo_type: str = "dataset") -> str:
        """Commit sha of a branch, tag or full commit sha; RepoNotFoundError / RevisionNotFoundError otherwise."""
        refs = self.refs(repo_id, repo_type)
        for kind in ("branches", "tags"):
            if rev in refs[kind]:
                return refs[kind][rev]
        for prefix, kind in (("refs/heads/", "branches"), ("refs/tags/", "tags")):
            if rev.startswith(prefix) and rev[len(prefix) :] in refs[kind]:
                return refs[kind][rev[len(prefix) :]]
        if (
            _FULL_SHA.match(rev)
            and (self._repo_dir(repo_id, repo_type) / "commits" / f"{rev}.json").is_file()
        ):
            return rev
        raise RevisionNotFoundError(f"revision {rev!r} not found in {repo_id!r}")

    def files(self, repo_id: str, rev: str = "main", repo_type: str = "dataset") -> dict[str, dict[str, Any]]:
        """{path: {"sha256", "size"}} of the commit `rev` resolves to."""
        return self.commit(repo_id, self.resolve(repo_id, rev, repo_type), repo_type)["files"]

    def object_path(self, sha256: str) -> Path:
        return self.root / "objects" / sha256

    def read(self, repo_id: str, rev: str, filename: str, repo_type: str = "dataset") -> bytes:
        entry = self.files(repo_id, rev, repo_type).get(filename)
        if entry is None:
            raise EntryNotFoundError(f"{filename!r} not found at {rev!r} of {repo_id!r}")
        return self.object_path(entry["sha256"]).read_bytes()

    # ---- writes -------------------------------------------------------------------------------------
    def publish(
        self,
        repo_id: str,
        files: Mapping[str, bytes | str | Path],
        message: str,
        branch: str = "main",
        *,
        delete: tuple[str, ...] = (),
        repo_type: str = "dataset",
    ) -> str:
        """Commit `files` (bytes or a path to read) on top of `branch`, creating the repo if needed; return the sha.

        Files not named keep their content from the parent commit; `delete` removes paths. A publish that changes
        nothing returns the branch's current sha and writes no commit.
        """
        repo_dir = self._repo_dir(repo_id, repo_type)
        with self._lock:
            refs = read_json(repo_dir / "refs.json") if (repo_dir / "refs.json").is_file() else None
            refs = refs or {"branches": {}, "tags": {}}
            parent = refs["branches"].get(branch)
            tree = dict(self.commit(repo_id, parent, repo_type)["files"]) if parent else {}
            for name in delete:
                tree.pop(_check_path(name), None)
            for name, content in sorted(files.items()):
                data = Path(content).read_bytes() if isinstance(content, Path) else content
                data = data.encode("utf-8") if isinstance(data, str) else data
                digest = sha256_bytes(data)
                if not self.object_path(digest).is_file():
                    atomic_write(self.object_path(digest), data)
                tree[_check_path(name)] = {"sha256": digest, "size": len(data)}
            if parent and tree == self.commit(repo_id, parent, repo_type)["files"]:
                return parent
            record = {"files": dict(sorted(tree.items())), "message": message, "parent": parent}
            sha = hashlib.sha1(stable_json(record, indent=None).encode()).hexdigest()
            atomic_write_json(repo_dir / "commits" / f"{sha}.json", record)
            refs["branches"][branch] = sha
            atomic_write_json(repo_dir / "refs.json", refs)
            return sha

    def tag(self, repo_id: str, tag: str, rev: str = "main", repo_type: str = "dataset") -> str:
        """Point tag `tag` at the commit `rev` resolves to; return that sha."""
        with self._lock:
            sha = self.resolve(repo_id, rev, repo_type)
            refs = self.refs(repo_id, repo_type)
            refs["tags"][tag] = sha
            atomic_write_json(self._repo_dir(repo_id, repo_type) / "refs.json", refs)
            return sha
