"""Lineage of an artifact: its record, its inputs' records, and so on back to the dataset commit."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sweflow.errors import ProvenanceError
from sweflow.provenance.records import (
    PROVENANCE_DIR,
    file_state,
    load_record,
    provenance_root,
    record_path,
    relpath,
)


def find_root(artifact: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """The provenance root for `artifact`: `root` if given; else the cwd if it holds `.provenance/`;
    else the nearest folder above the artifact that does. Falls back to provenance_root()."""
    if root is not None:
        return provenance_root(root)
    cwd = provenance_root()
    if (cwd / PROVENANCE_DIR).is_dir():
        return cwd
    for parent in Path(os.path.abspath(artifact)).parents:
        if (parent / PROVENANCE_DIR).is_dir():
            return parent
    return cwd


def lineage(artifact: str | os.PathLike, root: str | os.PathLike | None = None) -> dict[str, Any]:
    """The lineage tree of `artifact` as plain data (see the node keys below).

    Node: path, rule, kind, sha256, size, record, wildcards, params, dataset (where the rule declared it),
    datasets (all roots it descends from), current_sha256 (the file's hash now; None when it is gone),
    inputs (child nodes), repeat (True when the node was already
    shown elsewhere in the tree; its inputs are then left out). Inputs without a record are leaves with
    record None. Raises ProvenanceError naming the artifact when it has no record.
    """
    base = find_root(artifact, root)
    rel = relpath(artifact, base)
    try:
        load_record(artifact, base)  # the artifact itself must have a record: fail early with its name
    except ProvenanceError as exc:
        raise _unrecorded_error(exc, rel, base) from None
    return _node(rel, base, seen=set(), stack=())


def _unrecorded_error(exc: ProvenanceError, rel: str, base: Path) -> ProvenanceError:
    """`exc`, saying also which run manifest lists the artifact and whether the file still matches it."""
    from sweflow.provenance.verify import find_manifests, read_manifest

    for m in find_manifests(base):
        try:
            rows = read_manifest(m)
        except ProvenanceError:
            continue
        row = next((r for r in rows if isinstance(r, dict) and r.get("path") == rel), None)
        if row is None:
            continue
        st = file_state(base / rel)
        now = (
            "the file is gone"
            if st is None
            else (
                "the file still matches it"
                if st.sha256 == row.get("sha256")
                else f"the file no longer matches it (now {st.sha256[:12]})"
            )
        )
        where = m.relative_to(base).as_posix()
        return ProvenanceError(
            f"{exc.problem}; {where} lists it with sha256 {str(row.get('sha256'))[:12]} and {now}",
            file=exc.file,
            hint="its record was deleted; rerun the rule that makes it",
        )
    return exc


def problems(tree: dict[str, Any]) -> list[str]:
    """One line per node of a lineage tree whose file no longer matches its record (or is gone)."""
    out: list[str] = []
    seen: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        if node.get("record") and node["path"] not in seen:
            seen.add(node["path"])
            if node.get("current_sha256") is None:
                out.append(f"MISSING {node['path']}: the file is gone (record {node['record']})")
            elif node["current_sha256"] != node.get("sha256"):
                out.append(
                    f"DRIFTED {node['path']}: the file no longer matches its record {node['record']}"
                    f" (record {node['sha256'][:12]}, file {node['current_sha256'][:12]})"
                )
        for child in node.get("inputs") or []:
            walk(child)

    walk(tree)
    return out


def _node(rel: str, base: Path, seen: set[str], stack: tuple[str, ...]) -> dict[str, Any]:
    try:
        rp = record_path(base / rel, base)
    except ProvenanceError:
        rp = None
    if rp is None or not rp.is_file():
        return {"path": rel, "record": None, "inputs": []}
    rec = load_record(base / rel, base)
    art = rec["artifact"]
    node: dict[str, Any] = {
        "path": rel,
        "rule": rec.get("rule"),
        "kind": art.get("kind"),
        "sha256": art.get("sha256"),
        "size": art.get("size"),
        "record": rp.relative_to(base).as_posix(),
        "current_sha256": _current_sha(base / rel),
        "wildcards": rec.get("wildcards") or {},
        "params": rec.get("params") or {},
        "dataset": rec.get("dataset") if rec.get("dataset_origin") == "declared" else None,
        "datasets": rec.get("datasets") or [],
        "inputs": [],
        "repeat": rel in seen,
    }
    if node["repeat"] or rel in stack:
        node["repeat"] = True
        return node
    seen.add(rel)
    for inp in rec.get("inputs") or []:
        if inp.get("record"):
            child = _node(inp["path"], base, seen, (*stack, rel))
            if child.get("sha256") and inp.get("sha256") and child["sha256"] != inp["sha256"]:
                # The upstream record is newer than what this artifact was made from.
                child["consumed_sha256"] = inp["sha256"]
        else:
            child = {"path": inp["path"], "record": None, "sha256": inp.get("sha256"), "inputs": []}
            folder = _recorded_folder(inp["path"], base)
            if folder:  # a file inside a recorded directory output (e.g. a checkpoint's per-item files)
                child["member_of"] = folder
                child["inputs"] = [_node(folder, base, seen, (*stack, rel))]
        node["inputs"].append(child)
    return node


def _current_sha(path: Path) -> str | None:
    st = file_state(path)
    return st.sha256 if st else None


def _recorded_folder(rel: str, base: Path) -> str | None:
    """The nearest enclosing folder of `rel` that has its own provenance record, if any."""
    parent = Path(rel).parent
    while parent != Path(".") and parent != parent.parent:
        try:
            rp = record_path(base / parent, base)
        except ProvenanceError:
            return None
        if rp.is_file():
            return parent.as_posix()
        parent = parent.parent
    return None


def params_summary(params: dict[str, Any], width: int = 100) -> str:
    """`k=v` pairs on one line, values as compact JSON, long values and the whole line shortened."""
    parts = []
    for k in sorted(params):
        v = params[k]
        text = v if isinstance(v, str) else json.dumps(v, sort_keys=True, separators=(",", ":"))
        if len(text) > 40:
            text = text[:37] + "..."
        parts.append(f"{k}={text}")
    line = " ".join(parts)
    return line if len(line) <= width else line[: width - 3] + "..."


def _dataset_line(d: dict[str, Any]) -> str:
    return f"dataset {d.get('repo_id')} @ {d.get('revision')} sha {d.get('sha')}"


def format_lineage(tree: dict[str, Any]) -> str:
    """The lineage tree as indented text, one node per line, ending with the dataset root(s)."""
    lines: list[str] = []
    _format(tree, "", "", lines)
    roots = tree.get("datasets") or []
    if roots:
        lines.extend("root: " + _dataset_line(d) for d in roots)
    else:
        lines.append("root: no dataset recorded")
    return "\n".join(lines) + "\n"


def _label(node: dict[str, Any]) -> str:
    if node.get("record") is None:
        sha = node.get("sha256")
        where = f"(in {node['member_of']})" if node.get("member_of") else "(no record)"
        return f"{node['path']}  {where}" + (f"  {sha[:12]}" if sha else "")
    text = f"{node['path']}  [{node.get('rule')}]  {(node.get('sha256') or '')[:12]}"
    current = node.get("current_sha256")
    if current is None:
        text += "  (FILE GONE)"
    elif current != node.get("sha256"):
        text += f"  (FILE CHANGED: now {current[:12]})"
    if node.get("consumed_sha256"):
        text += f" (consumed {node['consumed_sha256'][:12]})"
    if node.get("repeat"):
        return text + "  (see above)"
    summary = params_summary({**node.get("wildcards", {}), **node.get("params", {})})
    return text + (f"  {summary}" if summary else "")


def _format(node: dict[str, Any], first: str, rest: str, lines: list[str]) -> None:
    lines.append(first + _label(node))
    children: list[Any] = list(node.get("inputs") or [])
    if node.get("dataset") and not node.get("repeat"):
        children.append(_dataset_line(node["dataset"]))
    for i, child in enumerate(children):
        last = i == len(children) - 1
        branch, cont = ("└── ", "    ") if last else ("├── ", "│   ")
        if isinstance(child, str):
            lines.append(rest + branch + child)
        else:
            _format(child, rest + branch, rest + cont, lines)
