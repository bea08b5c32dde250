"""Provenance records: one JSON file per artifact, in a parallel tree under `<root>/.provenance/`.

A record says what an artifact is (sha256, size), how it was made (rule, wildcards, redacted params, the
hash of every input and of the code, software versions), which dataset commit it descends from, and when
and where it was made.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sweflow
from sweflow.errors import ProvenanceError
from sweflow.provenance.environment import git_state, software_versions, sweflow_tree_sha256
from sweflow.provenance.redaction import jsonable, redact_value
from sweflow.slurm import current_job
from sweflow.util import atomic_write_json, read_json, secret_values, sha256_file, tree_files

SCHEMA = "sweflow.provenance/1"
PROVENANCE_DIR = ".provenance"
ROOT_ENV = "SWEFLOW_PROVENANCE_ROOT"


def provenance_root(root: str | os.PathLike | None = None) -> Path:
    """The folder holding `.provenance/`: `root` if given, else $SWEFLOW_PROVENANCE_ROOT, else the cwd.

    Snakemake runs scripts in its working directory, so the default is right inside rules.
    """
    if root is not None:
        return Path(root).resolve()
    env = os.environ.get(ROOT_ENV)
    return Path(env).resolve() if env else Path.cwd().resolve()


# Paths inside records are relative to the root (the Snakemake working directory), so a results tree can be
# moved or copied and still verify.
def relpath(path: str | os.PathLike, root: Path) -> str:
    """`path` relative to `root` (posix); outside the root: absolute, with the home folder written as `~`."""
    p = Path(os.path.abspath(Path(path).expanduser()))
    try:
        return p.relative_to(root).as_posix()
    except ValueError:
        home = Path.home()
        try:
            return "~/" + p.relative_to(home).as_posix()
        except ValueError:
            return p.as_posix()


def resolve(path: str, root: Path) -> Path:
    """Inverse of `relpath`: a recorded path back to a filesystem path."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else root / p


def record_path(artifact: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """Where the record of `artifact` lives: `<root>/.provenance/<artifact relative to root>.json`.

    Raises ProvenanceError for an artifact outside the root (it could not be found again by relative path).
    """
    base = provenance_root(root)
    rel = relpath(artifact, base)
    if rel.startswith(("/", "~")) or rel in ("", ".") or rel.split("/")[0] == PROVENANCE_DIR:
        raise ProvenanceError(
            "artifact is outside the provenance root",
            file=str(artifact),
            hint=f"root is {base}; run from the workflow's working directory or set {ROOT_ENV}",
        )
    return base / PROVENANCE_DIR / (rel + ".json")


@dataclass(frozen=True)
class FileState:
    """What an artifact is now: kind ('file' or 'dir'), sha256 and size in bytes."""

    kind: str
    sha256: str
    size: int


def file_state(path: str | os.PathLike) -> FileState | None:
    """Hash and size a file or folder (folders: sha256_tree order; size = sum of file sizes); None if absent."""
    p = Path(path)
    if p.is_file():
        return FileState("file", sha256_file(p), p.stat().st_size)
    if p.is_dir():
        # Same digest as sweflow.util.sha256_tree, computed here so each file is read once and sizes add up.
        h = hashlib.sha256()
        size = 0
        for f in tree_files(p):
            size += f.stat().st_size
            digest = sha256_file(f)
            h.update(f.relative_to(p).as_posix().encode() + b"\0" + digest.encode() + b"\n")
        return FileState("dir", h.hexdigest(), size)
    return None


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="milliseconds")


def _named_paths(items: Any) -> list[tuple[str | None, str]]:
    """(name, path) pairs from a list, a dict of path-or-list, or a snakemake Namedlist."""
    if items is None:
        return []
    if isinstance(items, str | os.PathLike):
        return [(None, os.fspath(items))]
    if isinstance(items, Mapping):
        pairs: list[tuple[str | None, str]] = []
        for name, value in items.items():
            values = [value] if isinstance(value, str | os.PathLike) else list(value)
            pairs.extend((str(name), os.fspath(v)) for v in values)
        return pairs
    values = [os.fspath(v) for v in items]
    names: dict[str, str] = {}
    if hasattr(items, "items") and callable(items.items):  # snakemake Namedlist: names for some entries
        for name, value in items.items():
            for v in [value] if isinstance(value, str | os.PathLike) else list(value):
                names.setdefault(os.fspath(v), str(name))
    return [(names.get(v), v) for v in values]


def load_record(artifact: str | os.PathLike, root: str | os.PathLike | None = None) -> dict[str, Any]:
    """The record of `artifact`; ProvenanceError naming the artifact when it has none or it is unreadable."""
    rp = record_path(artifact, root)
    if not rp.is_file():
        raise ProvenanceError("no provenance record", file=str(artifact), hint=f"expected {rp}")
    try:
        rec = read_json(rp)
    except (OSError, ValueError) as exc:
        raise ProvenanceError(f"unreadable provenance record: {exc}", file=str(rp)) from None
    if not isinstance(rec, dict) or "artifact" not in rec:
        raise ProvenanceError("not a sweflow provenance record", file=str(rp))
    return rec


def _dataset_entry(dataset: Mapping[str, Any]) -> dict[str, Any]:
    missing = [k for k in ("repo_id", "revision", "sha") if not dataset.get(k)]
    if missing:
        raise ProvenanceError(f"dataset is missing {', '.join(missing)}", field="dataset")
    return {
        "repo_id": str(dataset["repo_id"]),
        "revision": str(dataset["revision"]),
        "sha": str(dataset["sha"]),
    }


def write_records(
    outputs: Iterable[str | os.PathLike] | Mapping[str, Any],
    *,
    rule: str,
    wildcards: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    inputs: Iterable[str | os.PathLike] | Mapping[str, Any] = (),
    code: Iterable[str | os.PathLike] = (),
    log: Iterable[str | os.PathLike] = (),
    dataset: Mapping[str, Any] | None = None,
    started: float,
    ended: float | None = None,
    extra: Mapping[str, Any] | None = None,
    operational: Mapping[str, Any] | None = None,
    root: str | os.PathLike | None = None,
) -> list[Path]:
    """Write one provenance record per output (file or folder) and return the record paths.

    Call it after the outputs are complete. `dataset` ({repo_id, revision, sha}) is given by the rule that
    resolves the dataset; every other rule inherits it from its inputs' records. Params, wildcards and extra
    are redacted; the record never holds a secret. Raises ProvenanceError if an output does not exist.
    """
    base = provenance_root(root)
    ended = time.time() if ended is None else ended
    secrets = secret_values()

    out_paths = [p for _, p in _named_paths(outputs)]
    out_states = {}
    for p in out_paths:
        st = file_state(p)
        if st is None:
            raise ProvenanceError("output does not exist; write it before recording it", file=p)
        out_states[p] = st

    input_entries = []
    datasets: dict[str, dict[str, Any]] = {}
    for name, p in _named_paths(inputs):
        st = file_state(p)
        entry: dict[str, Any] = {"path": relpath(p, base), "name": name}
        entry.update(
            {"kind": st.kind, "sha256": st.sha256, "size": st.size}
            if st
            else {"kind": None, "sha256": None, "size": None}
        )
        entry["record"] = None
        try:
            rp = record_path(p, base)
        except ProvenanceError:
            rp = None
        if rp is not None and rp.is_file():
            entry["record"] = rp.relative_to(base).as_posix()
            try:
                upstream = read_json(rp)
                for d in upstream.get("datasets") or []:
                    datasets[d["sha"] + d["repo_id"]] = d
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("unreadable upstream provenance record %s", rp)
        input_entries.append(entry)
    input_entries.sort(key=lambda e: (e["path"], e["name"] or ""))

    if dataset is not None:
        declared = _dataset_entry(dataset)
        datasets = {declared["sha"] + declared["repo_id"]: declared}
        origin = "declared"
    else:
        origin = "inherited" if datasets else None
    dataset_list = [datasets[k] for k in sorted(datasets)]

    code = [os.fspath(c) for c in code]
    scripts = []
    for c in code:
        st = file_state(c)
        scripts.append({"path": relpath(c, base), "sha256": st.sha256 if st else None})
    code_dir = Path(code[0]) if code else base
    code_entry = {
        "scripts": scripts,
        "sweflow_version": sweflow.__version__,
        "sweflow_tree_sha256": sweflow_tree_sha256(),
        "git": git_state(code_dir),
    }

    common = {
        "schema": SCHEMA,
        "rule": rule,
        "wildcards": jsonable(wildcards or {}),
        "params": jsonable(params or {}),
        "inputs": input_entries,
        "code": code_entry,
        "software": software_versions(),
        "dataset": dataset_list[0] if len(dataset_list) == 1 else None,
        "datasets": dataset_list,
        "dataset_origin": origin,
        "log": sorted(relpath(p, base) for p in (os.fspath(x) for x in log)),
        "started": _iso(started),
        "ended": _iso(ended),
        "duration_s": round(max(0.0, ended - started), 3),
        "host": socket.gethostname(),
        # the Slurm job that made it (job id, node list, partition); None when it ran outside Slurm
        "slurm": current_job(),
        "extra": jsonable(extra or {}),
        # the config's operational values at run time (config/keys.yaml): not params, so never a rerun
        "operational": jsonable(operational or {}),
    }
    # Keys are redacted only where they name values (params, extra); elsewhere values only.
    common = redact_value(common, secrets, by_key=False)
    common["params"] = redact_value(common["params"], secrets)
    common["extra"] = redact_value(common["extra"], secrets)
    common["operational"] = redact_value(common["operational"], secrets)

    written = []
    for p in out_paths:
        st = out_states[p]
        rec = dict(common)
        rec["artifact"] = {"path": relpath(p, base), "kind": st.kind, "sha256": st.sha256, "size": st.size}
        rec["outputs"] = sorted(relpath(q, base) for q in out_paths)
        rp = record_path(p, base)
        atomic_write_json(rp, rec)
        written.append(rp)
    return written


def record_snakemake(
    smk: Any,
    *,
    code: Iterable[str | os.PathLike],
    started: float,
    dataset: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> list[Path]:
    """write_records for a `script:` job: reads rule, wildcards, params, input, output and log from `snakemake`.

    In a script, pass `code=[__file__]` (Snakemake points `__file__` at the original script).
    """
    return write_records(
        smk.output,
        rule=smk.rule,
        wildcards=dict(smk.wildcards.items()),
        params=dict(smk.params.items()),
        inputs=smk.input,
        code=code,
        log=list(smk.log),
        dataset=dataset,
        started=started,
        extra=extra,
    )
