"""Dataset revisions, downloads and split validation (both row shapes: raw SWE-Gym columns or SkyRL rows)."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import DatasetError
from .util import atomic_write, retry

SHA_RE = re.compile(r"^[0-9a-f]{40}$")

# field -> accepted kind; "list" fields may arrive as lists, numpy arrays or JSON strings.
REQUIRED_FIELDS: dict[str, str] = {
    "instance_id": "str",
    "repo": "str",
    "base_commit": "str",
    "patch": "str",
    "test_patch": "str",
    "problem_statement": "str",
    "version": "str",
    "FAIL_TO_PASS": "list",
    "PASS_TO_PASS": "list",
}
OPTIONAL_FIELDS: dict[str, str] = {
    "hints_text": "str",
    "created_at": "str",
    "environment_setup_commit": "str",
}
INSTANCE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*__[A-Za-z0-9][A-Za-z0-9._-]*-[A-Za-z0-9._-]+$")


def is_sha(revision: str) -> bool:
    return bool(SHA_RE.match(revision or ""))


def hub_endpoint_env(endpoint: str | None) -> dict[str, str]:
    """Environment for the Hub client pointed at `endpoint` (None keeps the user's setting)."""
    env = {"HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    if endpoint:
        env["HF_ENDPOINT"] = endpoint.rstrip("/")
    return env


def _hub_errors():
    from huggingface_hub import errors as hf_errors

    return hf_errors


def resolve_revision(
    repo_id: str,
    revision: str,
    *,
    endpoint: str | None = None,
    repo_type: str = "dataset",
    token: str | bool | None = None,
    timeout: float = 60,
    attempts: int = 3,
) -> str:
    """Revision (branch, tag or sha) -> commit sha. A full sha is returned as is, with no network call."""
    if is_sha(revision):
        return revision
    from huggingface_hub import HfApi

    hf_errors = _hub_errors()
    api = HfApi(endpoint=endpoint.rstrip("/") if endpoint else None, token=token)

    def call() -> str:
        info = api.repo_info(repo_id, repo_type=repo_type, revision=revision, timeout=timeout)
        if not info.sha:
            raise DatasetError(f"the Hub returned no commit sha for revision {revision!r}", file=repo_id)
        return info.sha

    where = endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    try:
        return retry(
            call,
            attempts=attempts,
            backoff=1.0,
            give_up_on=(hf_errors.RepositoryNotFoundError, hf_errors.RevisionNotFoundError, DatasetError),
            what=f"resolve {repo_id}@{revision}",
        )
    except hf_errors.RevisionNotFoundError:
        raise DatasetError(
            f"revision {revision!r} does not exist",
            file=f"{repo_type} {repo_id}",
            field="revision",
            hint="use an existing branch, tag or commit sha",
        ) from None
    except hf_errors.RepositoryNotFoundError:
        raise DatasetError(
            f"{repo_type} repository not found at {where}",
            file=f"{repo_type} {repo_id}",
            field="repo_id",
            hint="check dataset.repo_id and your Hub token",
        ) from None
    except DatasetError:
        raise
    except Exception as exc:  # connection refused, timeouts, 5xx after retries
        raise DatasetError(
            f"Hub endpoint {where} unreachable: {type(exc).__name__}: {exc}".splitlines()[0],
            file=f"{repo_type} {repo_id}",
            field="hub.endpoint",
            hint="check the network or dataset.hub.endpoint, or pin dataset.hub.offline_dir",
        ) from None


def download_file(
    repo_id: str,
    filename: str,
    sha: str,
    dest: str | os.PathLike,
    *,
    endpoint: str | None = None,
    repo_type: str = "dataset",
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    attempts: int = 4,
    timeout: float = 60,
) -> Path:
    """hf_hub_download at an exact commit sha, then an atomic copy to `dest` (no partial file is ever left)."""
    from huggingface_hub import hf_hub_download

    hf_errors = _hub_errors()
    if not is_sha(sha):
        raise DatasetError("download needs a resolved 40-hex commit sha", file=repo_id, field="revision")
    dest = Path(dest)

    def call() -> str:
        return hf_hub_download(
            repo_id,
            filename,
            repo_type=repo_type,
            revision=sha,
            endpoint=endpoint.rstrip("/") if endpoint else None,
            cache_dir=str(cache_dir) if cache_dir else None,
            token=token,
            etag_timeout=timeout,
        )

    try:
        cached = retry(
            call,
            attempts=attempts,
            backoff=1.0,
            give_up_on=(
                hf_errors.RepositoryNotFoundError,
                hf_errors.RevisionNotFoundError,
                hf_errors.EntryNotFoundError,
            ),
            what=f"download {repo_id}/{filename}@{sha[:12]}",
        )
    except hf_errors.EntryNotFoundError:
        raise DatasetError(
            f"file not found at commit {sha}", file=f"{repo_id}/{filename}", field="splits.file"
        ) from None
    except (hf_errors.RepositoryNotFoundError, hf_errors.RevisionNotFoundError) as exc:
        raise DatasetError(
            f"{type(exc).__name__} at commit {sha}", file=f"{repo_id}/{filename}", field="revision"
        ) from None
    except Exception as exc:
        raise DatasetError(
            f"download failed after {attempts} attempts: {type(exc).__name__}: {exc}".splitlines()[0],
            file=f"{repo_id}/{filename}",
            field="hub.endpoint",
        ) from None
    tmp = dest.with_name(f".{dest.name}.download")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cached, tmp)
    os.replace(tmp, dest)
    return dest


def copy_offline(src_dir: str | os.PathLike, filename: str, dest: str | os.PathLike) -> Path:
    """Offline mode: copy <src_dir>/<filename> atomically."""
    src = Path(src_dir) / filename
    if not src.is_file():
        raise DatasetError("file not found in the offline folder", file=str(src), field="hub.offline_dir")
    return atomic_write(dest, src.read_bytes())


# ---------------------------------------------------------------------------------------------- reading


def read_table_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a parquet file into plain Python rows (lists stay lists)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DatasetError(
            f"not a readable parquet file: {exc}".splitlines()[0], file=str(path), hint="re-download it"
        ) from None
    return table.to_pylist()


def _as_list(value: Any, *, file: str, row: int, fieldname: str) -> list[str]:
    if hasattr(value, "tolist") and not isinstance(value, str):  # numpy arrays from pandas
        value = value.tolist()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise DatasetError(
                "expected a list of test ids or a JSON list string, got a non-JSON string",
                file=file,
                row=row,
                field=fieldname,
            ) from None
    if not isinstance(value, list | tuple):
        raise DatasetError(
            f"expected a list of test ids, got {type(value).__name__}", file=file, row=row, field=fieldname
        )
    out = []
    for item in value:
        if not isinstance(item, str):
            raise DatasetError(
                f"expected test ids as strings, got {type(item).__name__}",
                file=file,
                row=row,
                field=fieldname,
            )
        out.append(item)
    return out


def _as_str(value: Any, *, file: str, row: int, fieldname: str, optional: bool) -> str:
    if value is None and optional:
        return ""
    if hasattr(value, "isoformat"):  # timestamps in created_at
        return value.isoformat()
    if not isinstance(value, str):
        raise DatasetError(
            f"expected a string, got {type(value).__name__}", file=file, row=row, field=fieldname
        )
    return value


def unwrap_row(row: dict[str, Any], *, shape: str, file: str, index: int) -> dict[str, Any]:
    """Return the SWE-Gym instance of a row: the row itself (raw) or its `instance` struct (SkyRL)."""
    has_instance = isinstance(row.get("instance"), dict)
    if shape == "skyrl" or (shape == "auto" and "instance" in row):
        if not has_instance:
            raise DatasetError(
                "SkyRL-shaped row needs an 'instance' struct", file=file, row=index, field="instance"
            )
        return dict(row["instance"])
    return dict(row)


def normalize_instance(inst: dict[str, Any], *, file: str, index: int) -> dict[str, Any]:
    """Check required fields and types; lists given as lists, arrays or JSON strings become lists of str."""
    out: dict[str, Any] = {}
    for name, kind in {**REQUIRED_FIELDS, **OPTIONAL_FIELDS}.items():
        optional = name in OPTIONAL_FIELDS
        if name not in inst:
            if optional:
                out[name] = ""
                continue
            raise DatasetError("required column is missing", file=file, row=index, field=name)
        value = inst[name]
        if kind == "list":
            out[name] = _as_list(value, file=file, row=index, fieldname=name)
        else:
            out[name] = _as_str(value, file=file, row=index, fieldname=name, optional=optional)
    for name in ("instance_id", "repo", "base_commit", "version", "problem_statement"):
        if not out[name].strip():
            raise DatasetError("must not be empty", file=file, row=index, field=name)
    if not INSTANCE_ID_RE.match(out["instance_id"]):
        raise DatasetError(
            f"instance id {out['instance_id']!r} is not of the form owner__repo-number",
            file=file,
            row=index,
            field="instance_id",
        )
    if not re.fullmatch(r"[0-9a-f]{7,40}", out["base_commit"]):
        raise DatasetError(
            f"base commit {out['base_commit']!r} is not a hex commit id",
            file=file,
            row=index,
            field="base_commit",
        )
    if not out["FAIL_TO_PASS"]:
        raise DatasetError(
            "FAIL_TO_PASS is empty: the task has no test that the fix must make pass",
            file=file,
            row=index,
            field="FAIL_TO_PASS",
        )
    if not out["environment_setup_commit"]:
        out["environment_setup_commit"] = out["base_commit"]
    return out


@dataclass
class SplitReport:
    file: str
    split: str
    rows: int
    expected_rows: int | None
    shape: str
    repos: dict[str, int] = field(default_factory=dict)
    instance_ids_sha256: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "split": self.split,
            "rows": self.rows,
            "expected_rows": self.expected_rows,
            "shape": self.shape,
            "repos": dict(sorted(self.repos.items())),
            "instance_ids_sha256": self.instance_ids_sha256,
            "ok": True,
        }


def load_split(
    path: str | os.PathLike,
    *,
    split: str,
    shape: str = "auto",
    expected_rows: int | None = None,
    display_name: str | None = None,
) -> tuple[list[dict[str, Any]], SplitReport]:
    """Read and validate a whole split; returns the normalised instances and a report. Raises DatasetError."""
    from .util import sha256_bytes

    file = display_name or str(path)
    rows = read_table_rows(path)
    if expected_rows is not None and len(rows) != expected_rows:
        raise DatasetError(
            f"split {split!r} has {len(rows)} rows, expected {expected_rows}",
            file=file,
            field=f"splits.{split}.rows",
            hint="wrong file or revision, or update the expected count",
        )
    seen: dict[str, int] = {}
    instances = []
    detected = "skyrl" if rows and "instance" in rows[0] and shape != "raw" else "raw"
    for i, row in enumerate(rows):
        inst = normalize_instance(unwrap_row(row, shape=shape, file=file, index=i), file=file, index=i)
        iid = inst["instance_id"]
        if iid in seen:
            raise DatasetError(
                f"duplicate instance id {iid!r} (first seen in row {seen[iid]})",
                file=file,
                row=i,
                field="instance_id",
            )
        seen[iid] = i
        instances.append(inst)
    repos: dict[str, int] = {}
    for inst in instances:
        repos[inst["repo"]] = repos.get(inst["repo"], 0) + 1
    report = SplitReport(
        file=file,
        split=split,
        rows=len(rows),
        expected_rows=expected_rows,
        shape=detected,
        repos=repos,
        instance_ids_sha256=sha256_bytes("\n".join(inst["instance_id"] for inst in instances)),
    )
    return instances, report


def apply_limit(instances: Sequence[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    """The `limit` option: first N rows, applied only after the whole split was validated."""
    return list(instances if limit is None else instances[:limit])
