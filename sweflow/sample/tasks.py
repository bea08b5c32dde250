"""The sample tasks as dataset rows (raw SWE-Gym columns or SkyRL rows), parquet files and harness tables.

Rows are read from the stored `tasks/<instance_id>/` files (made by `sweflow.sample.generate`), so reading
needs neither git nor pytest.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sweflow.errors import DatasetError
from sweflow.util import atomic_write, read_json

TASKS_DIR = Path(__file__).parent / "tasks"
DATA_SOURCE = "sweflow/calclib-sample"
ENV_CLASS = "swegym"

SPLITS: dict[str, tuple[str, ...]] = {
    "train": tuple(f"sweflow__calclib-{n}" for n in (1, 2, 3, 5, 6, 7)),
    "validation": ("sweflow__calclib-4", "sweflow__calclib-8"),
}
# Kept out of both splits: the "upstream publishes one more task" case (base = the newest commit).
EXTRA_ID = "sweflow__calclib-9"

# SWE-Gym column order, then the SWE-bench column SWE-Gym lacks.
RAW_COLUMNS = (
    "instance_id",
    "hints_text",
    "patch",
    "test_patch",
    "created_at",
    "problem_statement",
    "repo",
    "base_commit",
    "version",
    "PASS_TO_PASS",
    "FAIL_TO_PASS",
    "environment_setup_commit",
)
_LIST_COLUMNS = ("PASS_TO_PASS", "FAIL_TO_PASS")

RAW_SCHEMA = pa.schema(
    [(c, pa.list_(pa.string()) if c in _LIST_COLUMNS else pa.string()) for c in RAW_COLUMNS]
)
SKYRL_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("env_class", pa.string()),
        ("instance", pa.struct(list(RAW_SCHEMA))),
    ]
)

# Tables the harness layer merges into swebench's MAP_REPO_VERSION_TO_SPECS / MAP_REPO_TO_EXT /
# MAP_REPO_TO_PARSER (the parser is named, as it is a function of the configured harness package).
HARNESS_SPECS: dict[str, dict[str, dict[str, Any]]] = {
    "sweflow/calclib": {
        "0.1": {
            "python": "3.11",
            "packages": "pytest",
            "pip_packages": ["pytest"],
            "install": "true",
            "test_cmd": "pytest -rA",
        }
    }
}
HARNESS_EXT: dict[str, str] = {"sweflow/calclib": "py"}
HARNESS_PARSERS: dict[str, str] = {"sweflow/calclib": "parse_log_pytest"}


def instance_ids(split: str | None = None) -> tuple[str, ...]:
    """Instance ids of a split, or of every stored task (both splits and the extra one) when split is None."""
    if split is None:
        return (*SPLITS["train"], *SPLITS["validation"], EXTRA_ID)
    if split not in SPLITS:
        raise DatasetError(f"unknown sample split {split!r}", hint=f"use one of {sorted(SPLITS)}")
    return SPLITS[split]


def load_task(instance_id: str) -> dict[str, Any]:
    """One task as a raw SWE-Gym row (columns RAW_COLUMNS; the test lists are lists of str)."""
    folder = TASKS_DIR / instance_id
    if not (folder / "meta.json").is_file():
        raise DatasetError("unknown sample task", row=instance_id, file=str(folder))
    meta = read_json(folder / "meta.json")
    row = {c: meta[c] for c in RAW_COLUMNS if c not in ("patch", "test_patch")}
    row["patch"] = (folder / "gold.patch").read_text(encoding="utf-8")
    row["test_patch"] = (folder / "test.patch").read_text(encoding="utf-8")
    return {c: row[c] for c in RAW_COLUMNS}


def base_name(instance_id: str) -> str:
    """The name of the task's base commit in the sample history (see repo.HISTORY)."""
    return str(read_json(TASKS_DIR / instance_id / "meta.json")["base_name"])


def sample_rows(split: str, *, extra: bool = False) -> list[dict[str, Any]]:
    """Raw SWE-Gym rows of `split` ("train": 6 tasks, "validation": 2); extra=True adds the extra task to train."""
    ids = list(instance_ids(split))
    if extra and split == "train":
        ids.append(EXTRA_ID)
    return [load_task(i) for i in ids]


def numbered_rows(n: int, *, split: str = "train", first: int = 100000) -> list[dict[str, Any]]:
    """`n` rows cycling through the sample rows of `split`, each with its own instance id (so its own image):
    a dataset of any size for scale benchmarks and tests."""
    base = sample_rows(split)
    return [{**base[i % len(base)], "instance_id": f"sweflow__calclib-{first + i}"} for i in range(n)]


def to_skyrl(row: dict[str, Any]) -> dict[str, Any]:
    """Wrap a raw row in the SkyRL shape {data_source, prompt, env_class, instance}."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": row["problem_statement"]}],
        "env_class": ENV_CLASS,
        "instance": {c: row[c] for c in RAW_COLUMNS},
    }


def skyrl_rows(split: str, *, extra: bool = False) -> list[dict[str, Any]]:
    """SkyRL-shaped rows of `split` (same tasks and order as sample_rows)."""
    return [to_skyrl(r) for r in sample_rows(split, extra=extra)]


def extra_task() -> dict[str, Any]:
    """The extra, valid task kept out of both splits, as a raw row (its base commit is the newest one)."""
    return load_task(EXTRA_ID)


def _schema_for(rows: list[dict[str, Any]]) -> pa.Schema | None:
    keys = set(rows[0]) if rows else set(RAW_COLUMNS)
    if keys == set(RAW_COLUMNS):
        return RAW_SCHEMA
    if keys == set(SKYRL_SCHEMA.names):
        return SKYRL_SCHEMA
    return None


def parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    """Encode rows as parquet; the same rows always give the same bytes (with the same pyarrow)."""
    schema = _schema_for(rows)
    table = pa.Table.from_pylist(rows, schema=schema) if schema is not None else pa.Table.from_pylist(rows)
    buf = io.BytesIO()
    # No statistics, no page index, one row group, fixed compression: nothing here depends on time or host.
    pq.write_table(
        table,
        buf,
        compression="zstd",
        compression_level=3,
        write_statistics=False,
        write_page_index=False,
        use_dictionary=False,
        row_group_size=max(1, len(rows)),
        store_schema=True,
    )
    return buf.getvalue()


def write_parquet(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Atomically write rows as a byte-stable parquet file (raw and SkyRL shapes get explicit schemas)."""
    return atomic_write(path, parquet_bytes(rows))


def write_sample_dataset(dest: str | Path, *, shape: str = "skyrl", extra: bool = False) -> dict[str, Path]:
    """Write `train.parquet` and `validation.parquet` of the sample into `dest`; shape "skyrl" or "raw"."""
    if shape not in ("skyrl", "raw"):
        raise DatasetError(f"unknown row shape {shape!r}", hint="use 'skyrl' or 'raw'")
    make = skyrl_rows if shape == "skyrl" else sample_rows
    return {s: write_parquet(make(s, extra=extra), Path(dest) / f"{s}.parquet") for s in SPLITS}
