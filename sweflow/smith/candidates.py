"""Bug candidates: one diff plus metadata each, stored as JSONL shards; ids and shard assignment.

An id is `<owner>__<repo>.<commit8>.<strategy>__<hash8>` where hash8 is the first 8 hex digits of the
sha256 of the diff, so the same bug always gets the same id and two strategies never collide.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SmithError
from ..util import atomic_write, jsonl_line

STRATEGIES = ("procedural", "lm_modify", "lm_rewrite", "pr_mirror", "combine")
# The strategies whose candidates come straight from the repository (combine needs validated bugs first).
FIRST_STRATEGIES = ("procedural", "lm_modify", "lm_rewrite", "pr_mirror")


@dataclass(frozen=True)
class Candidate:
    """One proposed bug: `patch` turns the reference commit into the bugged state (a unified git diff).

    `meta` holds at least strategy-specific `entity` (the function/class/commit changed) and `explanation`;
    `files` are the repository paths the patch touches.
    """

    instance_id: str
    strategy: str
    patch: str
    files: tuple[str, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["files"] = list(self.files)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Candidate:
        return cls(d["instance_id"], d["strategy"], d["patch"], tuple(d["files"]), dict(d.get("meta") or {}))


def repo_slug(repo: str) -> str:
    """`owner/name` -> `owner__name` (the SWE-bench instance-id form)."""
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise SmithError(f"repository name {repo!r} is not owner/name", field="repo")
    return repo.replace("/", "__")


def instance_prefix(repo: str, commit: str) -> str:
    return f"{repo_slug(repo)}.{commit[:8]}"


def candidate_id(repo: str, commit: str, strategy: str, patch: str) -> str:
    if strategy not in STRATEGIES:
        raise SmithError(f"unknown strategy {strategy!r}", field="strategy", hint=f"one of {STRATEGIES}")
    digest = hashlib.sha256(patch.encode("utf-8")).hexdigest()[:8]
    return f"{instance_prefix(repo, commit)}.{strategy}__{digest}"


def make_candidate(
    repo: str, commit: str, strategy: str, patch: str, files: Iterable[str], **meta: Any
) -> Candidate:
    return Candidate(candidate_id(repo, commit, strategy, patch), strategy, patch, tuple(sorted(files)), meta)


def shard_of(key: str, shards: int) -> int:
    """A stable shard index for `key` (an entity name, a commit, an id) in [0, shards)."""
    if shards < 1:
        raise SmithError("shards must be at least 1", field="shards")
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:12], 16) % shards


def write_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> Path:
    """Atomically write records as JSONL (sorted keys, one per line); an empty shard is an empty file."""
    return atomic_write(path, "".join(jsonl_line(r) for r in records))


def read_jsonl(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise SmithError(f"not JSON: {exc.msg}", file=str(path), row=n) from exc


def read_candidates(path: str | os.PathLike) -> list[Candidate]:
    out = []
    for n, d in enumerate(read_jsonl(path), 1):
        try:
            out.append(Candidate.from_dict(d))
        except (KeyError, TypeError) as exc:
            raise SmithError(f"candidate lacks {exc}", file=str(path), row=n) from exc
    return out


def dedupe(cands: Iterable[Candidate]) -> list[Candidate]:
    """Drop repeated diffs (same id), keep first-seen order."""
    seen: set[str] = set()
    out = []
    for c in cands:
        if c.instance_id not in seen:
            seen.add(c.instance_id)
            out.append(c)
    return out
