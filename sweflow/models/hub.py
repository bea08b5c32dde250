"""A model repository on the Hub -> a checked local folder: resolve the revision, download the snapshot, check it.

`download_model` downloads at an exact commit sha and renames the checked folder into place: the
destination is either the complete snapshot or absent. Every failure is
one `ModelError` line naming the repository, the revision and the config field (`train.model.*`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
from pathlib import Path
from typing import Any

from ..dataset.hub_client import is_sha, resolve_revision
from ..errors import DatasetError, SweflowError
from ..schema import default
from ..util import redact, replace_folder, retry, sha256_file

log = logging.getLogger(__name__)

FIELD = "train.model"
# The folder huggingface_hub keeps inside local_dir (download metadata and the tree listing cache).
HF_LOCAL_CACHE = ".cache"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")


class ModelError(SweflowError):
    """A model repository, revision or snapshot is missing, unreachable or incomplete."""


def _where(endpoint: str | None) -> str:
    return redact(endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")


def resolve_model(
    repo_id: str,
    revision: str,
    *,
    endpoint: str | None = None,
    timeout: float = 60,
    source: str | None = None,
) -> dict[str, Any]:
    """{repo_id, repo_type: "model", revision, sha, source}: the commit sha `revision` (branch, tag or sha) names.

    A full 40-hex sha is returned as is with no network call. `source` names the Hub in the record (default:
    the endpoint URL with any credentials redacted; the stage passes "local-hub" for the bundled one, whose
    port changes from run to run).
    """
    try:
        sha = resolve_revision(repo_id, revision, endpoint=endpoint, repo_type="model", timeout=timeout)
    except DatasetError as exc:
        field = {"repo_id": "repo_id", "revision": "revision"}.get(exc.field or "", "endpoint")
        hint = {
            "repo_id": "check train.model.repo_id and your Hub token",
            "revision": "use an existing branch, tag or commit sha",
        }.get(field, "check the network or train.model.endpoint")
        raise ModelError(
            exc.problem,
            file=f"model {repo_id}@{revision}",
            field=f"{FIELD}.{field}",
            hint=hint,
        ) from None
    return {
        "repo_id": repo_id,
        "repo_type": "model",
        "revision": revision,
        "sha": sha,
        "source": source or (redact(endpoint) if endpoint else "huggingface.co"),
    }


# `download_model` runs the real `huggingface_hub.snapshot_download` at an exact commit sha into a temporary
# folder beside the destination, with retries, checks the result (`check_model_dir`), removes the `.cache/`
# folder that `snapshot_download(local_dir=...)` leaves there (its download metadata, not part of the model),
# and only then renames it into place: the destination is either the complete snapshot or absent.
def download_model(
    repo_id: str,
    sha: str,
    dest_dir: str | os.PathLike,
    *,
    endpoint: str | None = None,
    allow_patterns: list[str] | tuple[str, ...] | None = None,
    attempts: int = default("train.model.download_attempts"),
    timeout: float = 120,
    token: str | bool | None = None,
) -> dict[str, Any]:
    """Download the snapshot of `repo_id` at commit `sha` into `dest_dir` (replaced atomically); return its manifest.

    The manifest is {repo_id, sha, files: {relpath: {size, sha256}}, total_bytes}; `.cache/` is not in the
    folder. A rerun downloads again into a fresh temporary folder and swaps it in, so a stale or hand-edited
    destination never survives. Raises ModelError (missing repo or revision, network failure after
    `attempts`, or a snapshot without config, tokenizer or weights) and leaves no destination and no
    temporary folder behind.
    """
    from huggingface_hub import errors as hf_errors
    from huggingface_hub import snapshot_download

    where = f"model {repo_id}@{sha}"
    if not is_sha(sha):
        raise ModelError("download needs a resolved 40-hex commit sha", file=where, field=f"{FIELD}.revision")
    dest = Path(dest_dir)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.download-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)

    def call() -> str:
        return snapshot_download(
            repo_id,
            repo_type="model",
            revision=sha,
            allow_patterns=list(allow_patterns) if allow_patterns else None,
            local_dir=str(tmp),
            endpoint=endpoint.rstrip("/") if endpoint else None,
            token=token,
            etag_timeout=timeout,
        )

    try:
        retry(
            call,
            attempts=attempts,
            backoff=1.0,
            give_up_on=(hf_errors.RepositoryNotFoundError, hf_errors.RevisionNotFoundError),
            what=f"download {repo_id}@{sha[:12]}",
        )
        shutil.rmtree(tmp / HF_LOCAL_CACHE, ignore_errors=True)
        problems = check_model_dir(tmp)
        if problems:
            raise ModelError(
                "the snapshot is not a loadable model: " + "; ".join(problems),
                file=where,
                field=f"{FIELD}.revision",
                hint="pick a revision with config, tokenizer and safetensors weights, or widen train.model.allow_patterns",
            )
        manifest = model_manifest(tmp, repo_id=repo_id, sha=sha)
        replace_folder(tmp, dest)
    except ModelError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except hf_errors.RevisionNotFoundError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelError(
            "commit not found in the repository", file=where, field=f"{FIELD}.revision"
        ) from None
    except hf_errors.RepositoryNotFoundError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelError(
            f"model repository not found at {_where(endpoint)}",
            file=where,
            field=f"{FIELD}.repo_id",
            hint="check train.model.repo_id and your Hub token",
        ) from None
    except Exception as exc:  # connection refused, timeouts, 5xx after retries, a disk error
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelError(
            f"download failed after {attempts} attempts from {_where(endpoint)}: "
            f"{type(exc).__name__}: {exc}".splitlines()[0],
            file=where,
            field=f"{FIELD}.endpoint",
            hint="check the network or train.model.endpoint",
        ) from None
    log.info(
        "downloaded %s -> %s (%d files, %d bytes)",
        where,
        dest,
        len(manifest["files"]),
        manifest["total_bytes"],
    )
    return manifest


def model_manifest(path: str | os.PathLike, *, repo_id: str, sha: str) -> dict[str, Any]:
    """{repo_id, sha, files: {relpath: {size, sha256}}, total_bytes} of the files under `path` (no `.cache/`)."""
    root = Path(path)
    files: dict[str, dict[str, Any]] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and rel.parts[0] != HF_LOCAL_CACHE:
            files[rel.as_posix()] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
    return {
        "repo_id": repo_id,
        "sha": sha,
        "files": files,
        "total_bytes": sum(f["size"] for f in files.values()),
    }


def check_model_dir(path: str | os.PathLike) -> list[str]:
    """Problems that stop `path` from loading as a Hugging Face causal LM (empty list: it looks loadable).

    Cheap: parses config.json (and AutoConfig when transformers is installed), looks for a tokenizer file, and
    reads the safetensors headers (every shard of an index), no tensors and no torch.
    """
    root = Path(path)
    if not root.is_dir():
        return [f"{root} is not a folder"]
    problems = _check_config(root)
    if not any(
        (root / name).is_file() and (root / name).stat().st_size > 0 for name in TOKENIZER_FILES
    ) and not any(root.glob("*.tiktoken")):
        problems.append(f"no tokenizer file (one of {', '.join(TOKENIZER_FILES)}, *.tiktoken)")
    elif (
        (root / "vocab.json").is_file()
        and not (root / "tokenizer.json").is_file()
        and not (root / "merges.txt").is_file()
    ):
        problems.append("vocab.json without merges.txt")
    problems += _check_weights(root)
    return problems


def _check_config(root: Path) -> list[str]:
    cfg = root / "config.json"
    if not cfg.is_file():
        return ["no config.json"]
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return [f"config.json is not valid JSON ({exc})"]
    if not isinstance(data, dict) or not data.get("model_type"):
        return ["config.json has no model_type"]
    try:
        from transformers import AutoConfig
    except ImportError:  # the lean environments check the JSON only
        return []
    try:
        AutoConfig.from_pretrained(str(root))
    except Exception as exc:
        return [f"config.json does not load: {type(exc).__name__}: {exc}".splitlines()[0]]
    return []


def _safetensors_problem(path: Path) -> str | None:
    """None when `path` has a readable safetensors header whose tensors fit in the file, else the problem."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                return f"{path.name} is truncated"
            (n,) = struct.unpack("<Q", raw)
            if n > size - 8 or n > 100 << 20:
                return f"{path.name} has a bad header length"
            header = json.loads(fh.read(n))
    except (OSError, ValueError) as exc:
        return f"{path.name} is unreadable ({exc})"
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    if not ends:
        return f"{path.name} holds no tensors"
    if 8 + n + max(ends) > size:
        return f"{path.name} is truncated ({size} bytes, the header needs {8 + n + max(ends)})"
    return None


def _check_weights(root: Path) -> list[str]:
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return [f"model.safetensors.index.json is unreadable ({exc})"]
        missing = [s for s in shards if not (root / s).is_file()]
        if missing:
            return [f"weight shards missing: {', '.join(missing)}"]
        return [p for s in shards if (p := _safetensors_problem(root / s))]
    if (root / "model.safetensors").is_file():
        return [p] if (p := _safetensors_problem(root / "model.safetensors")) else []
    return ["no weights (model.safetensors or model.safetensors.index.json)"]
