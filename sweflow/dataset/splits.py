"""Split reading and validation (both row shapes: raw SWE-Gym columns or SkyRL rows).

A split is validated as a whole: any bad row fails it with ONE error listing every problem (see above
`load_split`). A valid row that the harness cannot handle is skipped per row at conversion
(`sweflow.dataset.convert`), not here.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import DatasetError

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
# swebench 5.x rows carry their own eval script and parser name: kept (as text) only when a row has them.
ROW_SCRIPT_FIELDS = ("eval_script", "log_parser", "image", "eval_type")
# SWE-bench / SWE-Gym `owner__repo-number`, or a synthesized task's `owner__repo.commit8.strategy__hash8`
# (sweflow.smith.candidates).
INSTANCE_ID_RE = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*__[A-Za-z0-9][A-Za-z0-9._-]*"
    r"(?:-[A-Za-z0-9._-]+|\.[0-9a-f]{8}\.[a-z_]+__[0-9a-f]{8})\Z"
)


# ---------------------------------------------------------------------------------------------- reading


def _text_as_binary(t):
    """The same Arrow type with every string replaced by binary, so reading never decodes UTF-8 (each field is
    decoded when checked, and a bad byte is a problem of its row and field, not a traceback)."""
    import pyarrow as pa

    if pa.types.is_string(t):
        return pa.binary()
    if pa.types.is_large_string(t):
        return pa.large_binary()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_text_as_binary(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_text_as_binary(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_text_as_binary(t.value_type)))
    return t


def read_table_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a parquet file into plain Python rows (lists stay lists; text stays undecoded bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # one file: ParquetFile, not read_table (whose dataset layer imports pandas, ~0.2 s per process)
        table = pq.ParquetFile(path).read()
        schema = pa.schema([f.with_type(_text_as_binary(f.type)) for f in table.schema])
        return table.cast(schema).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise DatasetError(
            f"not a readable parquet file: {exc}".splitlines()[0], file=str(path), hint="re-download it"
        ) from None


@dataclass(frozen=True)
class RowProblem:
    """One problem of a split: a row (None: the whole file) and field, and what is wrong."""

    problem: str
    row: int | None = None
    field: str | None = None
    instance_id: str | None = None


def _rows_text(rows: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "rows 0-2, 5"; [3] -> "row 3"."""
    if len(rows) == 1:
        return f"row {rows[0]}"
    spans, start, prev = [], rows[0], rows[0]
    for r in [*rows[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return "rows " + ", ".join(spans)


class BadRowsError(DatasetError):
    """Every problem of a split in one error: one line per problem (the same problem in several rows is one
    line naming them all); with more than one line, a first line says how many rows and problems. `note` (what
    to do) ends the first line."""

    def __init__(
        self, problems: Sequence[RowProblem], *, file: str, total_rows: int, what: str = "", note: str = ""
    ) -> None:
        self.problems = list(problems)
        self.total_rows = total_rows
        self.what = what
        self.note = note
        first = self.problems[0]
        super().__init__(first.problem, file=file, row=first.row, field=first.field)

    @property
    def bad_rows(self) -> list[int]:
        return sorted({p.row for p in self.problems if p.row is not None})

    def lines(self) -> list[str]:
        groups: dict[tuple[str | None, str], list[int]] = {}
        file_level = []
        for p in self.problems:
            if p.row is None:
                file_level.append(DatasetError(p.problem, file=self.file, field=p.field).one_line())
            else:
                groups.setdefault((p.field, p.problem), []).append(p.row)
        out = list(file_level)
        for (fieldname, problem), rows in sorted(groups.items(), key=lambda kv: min(kv[1])):
            where = f"{self.file}: {_rows_text(sorted(set(rows)))}"
            where += f": field {fieldname!r}" if fieldname is not None else ""
            out.append(" ".join(f"{where}: {problem}".split("\n")))
        return out

    def one_line(self) -> str:
        lines = self.lines()
        from ..util import redact  # like every error message: a row may quote a URL with credentials

        if len(lines) == 1:
            return redact(lines[0] + (f" ({self.note})" if self.note else ""))
        bad = self.bad_rows
        head = f"{self.file}: {len(bad)} bad row{'s' * (len(bad) != 1)} of {self.total_rows}"
        head += f" {self.what}" if self.what else ""
        head += f", {len(lines)} problems (one per line below)"
        head += f"; {self.note}" if self.note else ""
        return redact("\n".join([head, *(f"  {ln}" for ln in lines)]))


class _Bad(Exception):
    """A field's problem inside one row (collected, never shown as is)."""


def _decode(value: Any) -> Any:
    """Bytes (text columns are read undecoded) -> str, strictly; a str must encode to UTF-8."""
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Bad(f"not valid UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start}") from None
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _Bad(f"not valid UTF-8 text: unpaired surrogate at character {exc.start}") from None
    return value


def _as_list(value: Any) -> list[str]:
    if value is None:
        raise _Bad("is null, expected a list of test ids")
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):  # numpy arrays from pandas
        value = value.tolist()
    value = _decode(value)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise _Bad("expected a list of test ids or a JSON list string, got a non-JSON string") from None
    if not isinstance(value, list | tuple):
        raise _Bad(f"expected a list of test ids, got {type(value).__name__}")
    try:  # the common case at once: every id undecoded bytes of valid UTF-8 (the loop names a problem)
        if set(map(type, value)) <= {bytes}:
            return [item.decode("utf-8") for item in value]
    except UnicodeDecodeError:
        pass
    out = []
    for item in value:
        item = _decode(item)
        if not isinstance(item, str):
            raise _Bad(f"expected test ids as strings, got {type(item).__name__}")
        out.append(item)
    return out


def _as_str(value: Any, *, optional: bool) -> str:
    if value is None:
        if optional:
            return ""
        raise _Bad("is null, expected a string")
    if hasattr(value, "isoformat"):  # timestamps in created_at
        return value.isoformat()
    value = _decode(value)
    if not isinstance(value, str):
        raise _Bad(f"expected a string, got {type(value).__name__}")
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


def check_instance(
    inst: dict[str, Any], *, index: int, max_problem_statement_chars: int | None = None
) -> tuple[dict[str, Any], list[RowProblem]]:
    """Check one row's fields and types; every problem of the row is returned, none raised. Lists given as
    lists, arrays or JSON strings become lists of str; text must be valid UTF-8."""
    out: dict[str, Any] = {}
    problems: list[RowProblem] = []

    def bad(fieldname: str, problem: str) -> None:
        problems.append(RowProblem(problem, row=index, field=fieldname))

    for name, kind in {**REQUIRED_FIELDS, **OPTIONAL_FIELDS}.items():
        optional = name in OPTIONAL_FIELDS
        if name not in inst:
            if optional:
                out[name] = ""
            else:
                bad(name, "required column is missing")
            continue
        try:
            out[name] = _as_list(inst[name]) if kind == "list" else _as_str(inst[name], optional=optional)
        except _Bad as exc:
            bad(name, str(exc))
    for name in ROW_SCRIPT_FIELDS:
        if inst.get(name) is not None:
            try:
                out[name] = _as_str(inst[name], optional=True)
            except _Bad as exc:
                bad(name, str(exc))
    ok = {name for name in out}
    for name in ("instance_id", "repo", "base_commit", "version", "problem_statement"):
        if name in ok and not out[name].strip():
            bad(name, "must not be empty")
            ok.discard(name)
    if "instance_id" in ok and not INSTANCE_ID_RE.match(out["instance_id"]):
        bad(
            "instance_id",
            f"instance id {out['instance_id']!r} is not of the form owner__repo-number (or owner__repo.commit8.strategy__hash8)",
        )
    if "base_commit" in ok and not re.fullmatch(r"[0-9a-f]{7,40}", out["base_commit"]):
        bad("base_commit", f"base commit {out['base_commit']!r} is not a hex commit id")
    if "FAIL_TO_PASS" in ok and not out["FAIL_TO_PASS"]:
        bad("FAIL_TO_PASS", "FAIL_TO_PASS is empty: the task has no test that the fix must make pass")
    limit = max_problem_statement_chars
    if "problem_statement" in ok and limit is not None and len(out["problem_statement"]) > limit:
        bad(
            "problem_statement",
            f"{len(out['problem_statement'])} characters, over the limit of {limit}"
            " (raise dataset.max_problem_statement_chars, or null for no limit)",
        )
    if not out.get("environment_setup_commit") and "base_commit" in ok:
        out["environment_setup_commit"] = out["base_commit"]
    return out, problems


def normalize_instance(
    inst: dict[str, Any], *, file: str, index: int, max_problem_statement_chars: int | None = None
) -> dict[str, Any]:
    """check_instance for one row, raising BadRowsError with all of its problems."""
    out, problems = check_instance(inst, index=index, max_problem_statement_chars=max_problem_statement_chars)
    if problems:
        raise BadRowsError(problems, file=file, total_rows=1)
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
    max_problem_statement_chars: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "split": self.split,
            "rows": self.rows,
            "expected_rows": self.expected_rows,
            "shape": self.shape,
            "repos": dict(sorted(self.repos.items())),
            "instance_ids_sha256": self.instance_ids_sha256,
            "max_problem_statement_chars": self.max_problem_statement_chars,
            "ok": True,
        }


# Bad rows: a split is validated as a whole and every problem of every row (missing or mistyped field, invalid
# UTF-8, a problem statement over `dataset.max_problem_statement_chars`, duplicate ids) is collected; any
# problem fails the split with ONE error listing them all (file, row, field, problem, a line each). A row that
# breaks the schema means the file is not what the config says, and dropping it silently would change the
# dataset's identity.
def load_split(
    path: str | os.PathLike,
    *,
    split: str,
    shape: str = "auto",
    expected_rows: int | None = None,
    display_name: str | None = None,
    max_problem_statement_chars: int | None = None,
) -> tuple[list[dict[str, Any]], SplitReport]:
    """Read and validate a whole split; returns the normalised instances and a report.

    Every problem of every row is collected first; any problem fails the split with one BadRowsError that
    lists them all (a wrong row count is listed too)."""
    from ..util import sha256_bytes

    file = display_name or str(path)
    rows = read_table_rows(path)
    problems: list[RowProblem] = []
    if expected_rows is not None and len(rows) != expected_rows:
        problems.append(
            RowProblem(
                f"split {split!r} has {len(rows)} rows, expected {expected_rows}"
                " (wrong file or revision, or update the expected count)",
                field=f"splits.{split}.rows",
            )
        )
    seen: dict[str, int] = {}
    instances = []
    detected = "skyrl" if rows and "instance" in rows[0] and shape != "raw" else "raw"
    for i, row in enumerate(rows):
        try:
            raw = unwrap_row(row, shape=shape, file=file, index=i)
        except DatasetError as exc:
            problems.append(RowProblem(exc.problem, row=i, field=exc.field))
            continue
        inst, row_problems = check_instance(
            raw, index=i, max_problem_statement_chars=max_problem_statement_chars
        )
        problems.extend(row_problems)
        iid = inst.get("instance_id")
        if iid is not None and iid in seen:
            problems.append(
                RowProblem(
                    f"duplicate instance id {iid!r} (first seen in row {seen[iid]})",
                    row=i,
                    field="instance_id",
                )
            )
        elif iid is not None:
            seen[iid] = i
        instances.append(inst)
    if problems:
        raise BadRowsError(problems, file=file, total_rows=len(rows), what=f"in split {split!r}")
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
        max_problem_statement_chars=max_problem_statement_chars,
    )
    return instances, report


def apply_limit(instances: Sequence[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    """The `limit` option: first N rows, applied only after the whole split was validated."""
    return list(instances if limit is None else instances[:limit])
