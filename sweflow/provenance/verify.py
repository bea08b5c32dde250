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


@dataclass(frozen=True)
class Problem:
    """One mismatch: kind 'drifted' or 'missing'; role says whether `path` is the record's artifact, one of
    its inputs, or the record disagrees with the manifest ('manifest')."""

    kind: str
    path: str
    expected: str | None
    actual: str | None
    record: str
    role: str

    def line(self) -> str:
        if self.kind == "missing":
            return f"MISSING {self.path} (expected {_short(self.expected)}; {self.role} of {self.record})"
        return (
            f"DRIFTED {self.path}: expected {_short(self.expected)}, actual {_short(self.actual)}"
            f" ({self.role} of {self.record})"
        )


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "nothing"


@dataclass
class VerifyReport:
    """Result of verify(): artifacts checked, and every problem found."""

    checked: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def drifted(self) -> list[str]:
        return sorted({p.path for p in self.problems if p.kind == "drifted"})

    @property
    def missing(self) -> list[str]:
        return sorted({p.path for p in self.problems if p.kind == "missing"})

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return f"verified {self.checked} artifacts, {len(self.drifted)} drifted, {len(self.missing)} missing"


ProgressFn = Callable[[int, int, str, bool], None]


def verify(
    root: str | os.PathLike = ".",
    manifest: str | os.PathLike | None = None,
    *,
    on_item: ProgressFn | None = None,
) -> VerifyReport:
    """Recompute every recorded artifact's hash and every record's input hashes; report what differs.

    With `manifest`, its rows are the artifacts to check (and each row must agree with its record);
    otherwise every record under `<root>/.provenance`. `on_item(i, total, path, ok)` is called per artifact.
    Raises ProvenanceError when there is nothing to verify (no records, bad manifest).
    """
    base = provenance_root(root)
    items: list[
        tuple[str, str | None, dict[str, Any] | None, str]
    ] = []  # path, expected, record, record path
    report = VerifyReport()
    if manifest is not None:
        for row in read_manifest(manifest):
            rel = row.get("record") or f"{PROVENANCE_DIR}/{row['path']}.json"
            rp = base / rel
            rec = _read_record(rp) if rp.is_file() else None
            if rec is None:
                report.problems.append(Problem("missing", rel, row.get("sha256"), None, rel, "record"))
            elif rec.get("artifact", {}).get("sha256") != row.get("sha256"):
                report.problems.append(
                    Problem("drifted", rel, row.get("sha256"), rec["artifact"].get("sha256"), rel, "manifest")
                )
            items.append((row["path"], row.get("sha256"), rec, rel))
    else:
        for rp, rec in iter_records(base):
            items.append(
                (rec["artifact"]["path"], rec["artifact"].get("sha256"), rec, rp.relative_to(base).as_posix())
            )
        if not items:
            raise ProvenanceError(
                f"no provenance records under {base / PROVENANCE_DIR}", hint="run the workflow first"
            )

    states: dict[str, FileState | None] = {}

    def state(path: str) -> FileState | None:
        if path not in states:
            states[path] = file_state(resolve(path, base))
        return states[path]

    total = len(items)
    for i, (path, expected, rec, rel) in enumerate(items, 1):
        before = len(report.problems)
        st = state(path)
        if st is None:
            report.problems.append(Problem("missing", path, expected, None, rel, "artifact"))
        elif st.sha256 != expected:
            report.problems.append(Problem("drifted", path, expected, st.sha256, rel, "artifact"))
        for inp in (rec or {}).get("inputs") or []:
            if not inp.get("sha256"):
                continue  # the input did not exist when the record was written; nothing to compare
            ist = state(inp["path"])
            if ist is None:
                report.problems.append(Problem("missing", inp["path"], inp["sha256"], None, rel, "input"))
            elif ist.sha256 != inp["sha256"]:
                report.problems.append(
                    Problem("drifted", inp["path"], inp["sha256"], ist.sha256, rel, "input")
                )
        report.checked += 1
        if on_item is not None:
            on_item(i, total, path, len(report.problems) == before)
    return report
