"""The run manifest (a lock file of every recorded artifact) and verification of artifacts against records."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweflow.errors import ProvenanceError
from sweflow.provenance.records import PROVENANCE_DIR, FileState, file_state, provenance_root, resolve
from sweflow.util import log, read_json, stable_json, write_if_changed

MANIFEST_SCHEMA = "sweflow.manifest/1"


def iter_records(root: str | os.PathLike = ".") -> Iterator[tuple[Path, dict[str, Any]]]:
    """(record path, record) for every record under `<root>/.provenance`, in sorted path order.

    An unreadable or foreign JSON file raises ProvenanceError naming it.
    """
    base = provenance_root(root)
    top = base / PROVENANCE_DIR
    if not top.is_dir():
        return
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in filenames:
            # Temp files of an interrupted atomic write start with '.'.
            if name.endswith(".json") and not name.startswith("."):
                found.append(Path(dirpath) / name)
    for rp in sorted(found):
        yield rp, _read_record(rp)


def manifest_entries(root: str | os.PathLike = ".") -> tuple[list[dict[str, Any]], int]:
    """Manifest rows for every record whose artifact still exists, and how many records were skipped.

    Records of vanished artifacts (Snakemake temp() outputs, removed rules) are skipped, not listed.
    """
    base = provenance_root(root)
    entries, skipped = [], 0
    for rp, rec in iter_records(base):
        art = rec["artifact"]
        if not resolve(art["path"], base).exists():
            skipped += 1
            continue
        entries.append(
            {
                "path": art["path"],
                "kind": art.get("kind"),
                "sha256": art.get("sha256"),
                "size": art.get("size"),
                "rule": rec.get("rule"),
                "record": rp.relative_to(base).as_posix(),
                "dataset_shas": sorted({d["sha"] for d in rec.get("datasets") or [] if d.get("sha")}),
            }
        )
    entries.sort(key=lambda e: e["path"])
    return entries, skipped


def _read_record(rp: Path) -> dict[str, Any]:
    try:
        rec = read_json(rp)
    except (OSError, ValueError) as exc:
        raise ProvenanceError(f"unreadable provenance record: {exc}", file=str(rp)) from None
    if not isinstance(rec, dict) or not isinstance(rec.get("artifact"), dict):
        raise ProvenanceError("not a sweflow provenance record", file=str(rp))
    return rec


def write_manifest(path: str | os.PathLike, root: str | os.PathLike = ".") -> Path:
    """Write the run manifest: sorted, timestamp-free JSON listing every recorded artifact that exists.

    Two runs producing identical artifacts give byte-identical manifests. The file is rewritten only when
    its content changes (its mtime stays put otherwise). Relative `path` is taken relative to the cwd.
    """
    base = provenance_root(root)
    entries, skipped = manifest_entries(base)
    if skipped:
        log.warning("manifest: %d record(s) name artifacts that no longer exist; left out", skipped)
    datasets: dict[str, dict[str, Any]] = {}
    for _, rec in iter_records(base):
        for d in rec.get("datasets") or []:
            datasets[d.get("sha", "") + d.get("repo_id", "")] = d
    doc = {
        "schema": MANIFEST_SCHEMA,
        "datasets": [datasets[k] for k in sorted(datasets)],
        "artifacts": entries,
    }
    out = Path(path)
    write_if_changed(out, stable_json(doc))
    return out


def read_manifest(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The artifact rows of a manifest; ProvenanceError naming the file if it is not one."""
    try:
        doc = read_json(path)
    except (OSError, ValueError) as exc:
        raise ProvenanceError(f"unreadable manifest: {exc}", file=str(path)) from None
    if (
        not isinstance(doc, dict)
        or doc.get("schema") != MANIFEST_SCHEMA
        or not isinstance(doc.get("artifacts"), list)
    ):
        raise ProvenanceError("not a sweflow manifest", file=str(path), field="schema")
    return doc["artifacts"]


MANIFEST_NAME = "manifest.json"


def find_manifests(root: str | os.PathLike = ".") -> list[Path]:
    """The run manifests under `root`: `results/<dataset>/manifest.json`, sorted."""
    return sorted(provenance_root(root).glob(f"results/*/{MANIFEST_NAME}"))


@dataclass(frozen=True)
class Problem:
    """One mismatch. kind: 'drifted', 'missing' or 'unrecorded' (listed or referenced, but no record).

    role: what `path` is to `record` (the record or manifest that holds the expectation): 'artifact' (the
    record's own artifact), 'input' (one of its inputs), 'listed' (a manifest row without a record), or
    'record' (the artifact's record disagrees with the manifest `record`)."""

    kind: str
    path: str
    expected: str | None
    actual: str | None
    record: str
    role: str

    def line(self) -> str:
        where = f"listed in {self.record}" if self.role == "listed" else f"{self.role} of {self.record}"
        if self.kind == "unrecorded":
            if self.role == "input":
                return f"UNRECORDED {self.path}: its record {self.expected} is gone (input of {self.record})"
            return f"UNRECORDED {self.path}: {where}, but its record {self.expected} is gone"
        if self.kind == "missing":
            return f"MISSING {self.path} (expected {_short(self.expected)}; {where})"
        if self.role == "record":
            return (
                f"DRIFTED {self.path}: {self.record} says {_short(self.expected)},"
                f" its record says {_short(self.actual)}"
            )
        return (
            f"DRIFTED {self.path}: expected {_short(self.expected)}, actual {_short(self.actual)} ({where})"
        )


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "nothing"


@dataclass
class VerifyReport:
    """Result of verify(): artifacts checked, how many were fully consistent, and every problem found."""

    checked: int = 0
    ok_count: int = 0
    manifests: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def _paths(self, kind: str) -> list[str]:
        return sorted({p.path for p in self.problems if p.kind == kind})

    @property
    def drifted(self) -> list[str]:
        return self._paths("drifted")

    @property
    def missing(self) -> list[str]:
        return self._paths("missing")

    @property
    def unrecorded(self) -> list[str]:
        return self._paths("unrecorded")

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return (
            f"verified {self.checked} artifacts: {self.ok_count} ok, {len(self.drifted)} drifted,"
            f" {len(self.missing)} missing, {len(self.unrecorded)} unrecorded"
        )


ProgressFn = Callable[[int, int, str, bool], None]


def _rel(path: Path, base: Path) -> str:
    try:
        return path.resolve().relative_to(base).as_posix()
    except ValueError:
        return str(path)


def verify(
    root: str | os.PathLike = ".",
    manifest: str | os.PathLike | None = None,
    *,
    on_item: ProgressFn | None = None,
) -> VerifyReport:
    """Recompute the hash of every recorded or manifest-listed artifact and of every record's inputs.

    Without `manifest`: every record under `<root>/.provenance` and every row of each run manifest
    (find_manifests); with it: that manifest's rows only. A listed artifact without a record, or an input
    whose record has gone, is 'unrecorded'; its file is still checked against the manifest's hash. An
    artifact counts as ok when it, its record, the manifest and its inputs all agree. `on_item(i, total,
    path, ok)` is called per artifact. Raises ProvenanceError when there is nothing to verify or a manifest
    is unreadable.
    """
    base = provenance_root(root)
    report = VerifyReport()
    records: dict[str, tuple[str, dict[str, Any]]] = {}  # artifact path -> (record path, record)
    listed: dict[str, list[tuple[str, dict[str, Any]]]] = {}  # artifact path -> [(manifest, row)]
    if manifest is None:
        manifests = find_manifests(base)
        for rp, rec in iter_records(base):
            records[rec["artifact"]["path"]] = (rp.relative_to(base).as_posix(), rec)
    else:
        manifests = [Path(manifest)]
    for m in manifests:
        mrel = _rel(m, base)
        report.manifests.append(mrel)
        for n, row in enumerate(read_manifest(m), 1):
            if not isinstance(row, dict) or not isinstance(row.get("path"), str):
                raise ProvenanceError("manifest row has no artifact path", file=mrel, row=n, field="path")
            listed.setdefault(row["path"], []).append((mrel, row))
            if manifest is not None and row["path"] not in records:
                rel = row.get("record") or f"{PROVENANCE_DIR}/{row['path']}.json"
                if (base / rel).is_file():
                    records[row["path"]] = (rel, _read_record(base / rel))
    if not records and not listed:
        raise ProvenanceError(
            f"no provenance records under {base / PROVENANCE_DIR}", hint="run the workflow first"
        )

    states: dict[str, FileState | None] = {}

    def state(path: str) -> FileState | None:
        if path not in states:
            states[path] = file_state(resolve(path, base))
        return states[path]

    flagged_unrecorded: set[str] = set()
    paths = sorted(set(records) | set(listed))
    for i, path in enumerate(paths, 1):
        found: list[Problem] = []
        stale_input = False
        st = state(path)
        rel, rec = records.get(path, (None, None))
        rows = listed.get(path, [])
        if rec is not None:
            expectations = [(rec["artifact"].get("sha256"), rel, "artifact")]
            for mrel, row in rows:
                if row.get("sha256") != rec["artifact"].get("sha256"):
                    found.append(
                        Problem(
                            "drifted", path, row.get("sha256"), rec["artifact"].get("sha256"), mrel, "record"
                        )
                    )
        else:
            expectations = [(row.get("sha256"), mrel, "listed") for mrel, row in rows]
            if st is not None and path not in flagged_unrecorded:
                expected_rec = rows[0][1].get("record") or f"{PROVENANCE_DIR}/{path}.json"
                found.append(Problem("unrecorded", path, expected_rec, None, rows[0][0], "listed"))
                flagged_unrecorded.add(path)
        for expected, source, role in expectations[:1] if st is None else expectations:
            if st is None:
                found.append(Problem("missing", path, expected, None, source, role))
            elif st.sha256 != expected:
                found.append(Problem("drifted", path, expected, st.sha256, source, role))
        for inp in (rec or {}).get("inputs") or []:
            if not inp.get("sha256"):
                continue  # the input did not exist when the record was written; nothing to compare
            ist = state(inp["path"])
            if ist is None:
                found.append(Problem("missing", inp["path"], inp["sha256"], None, rel, "input"))
                continue
            if ist.sha256 != inp["sha256"]:
                found.append(Problem("drifted", inp["path"], inp["sha256"], ist.sha256, rel, "input"))
            if inp.get("record") and not (base / inp["record"]).is_file():
                stale_input = True  # an input whose record was deleted: this artifact is not ok either
                if inp["path"] not in flagged_unrecorded:  # one line per unrecorded file, not per consumer
                    flagged_unrecorded.add(inp["path"])
                    found.append(Problem("unrecorded", inp["path"], inp["record"], None, rel, "input"))
        report.problems.extend(found)
        report.checked += 1
        item_ok = not found and not stale_input
        report.ok_count += item_ok
        if on_item is not None:
            on_item(i, len(paths), path, item_ok)
    return report
