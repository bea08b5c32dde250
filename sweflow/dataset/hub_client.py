"""The Hugging Face Hub client side: a revision (branch, tag or sha) -> its commit sha, one file at that sha.

Both go through the real `huggingface_hub` client (pointed at the local Hub of `sweflow.offline.local_hub`
by `hub_endpoint_env`), with retries; every failure is one DatasetError naming the repository, file and
config field. The offline mode copies the split files from a folder instead.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from ..errors import DatasetError
from ..schema import default
from ..util import atomic_write, retry

SHA_RE = re.compile(r"^[0-9a-f]{40}\Z")


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
    attempts: int = default("dataset.hub.download_attempts"),
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
