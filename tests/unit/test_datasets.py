"""Split reading and validation: both row shapes, list normalisation, and one-line errors for bad input."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sweflow.datasets import apply_limit, is_sha, load_split, resolve_revision
from sweflow.errors import DatasetError
from sweflow.stages import validate_split


def row(i: int, **over):
    base = {
        "instance_id": f"acme__widgets-{i}",
        "repo": "acme/widgets",
        "base_commit": f"{i:040x}",
        "patch": "diff --git a/w.py b/w.py\n",
        "test_patch": "diff --git a/tests/test_w.py b/tests/test_w.py\n",
        "problem_statement": f"Widget {i} breaks",
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "version": "1.0",
        "FAIL_TO_PASS": [f"tests/test_w.py::test_{i}"],
        "PASS_TO_PASS": ["tests/test_w.py::test_ok"],
    }
    base.update(over)
    return base


def write(tmp_path, rows, name="train.parquet", schema=None):
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def test_raw_rows_validate_and_keep_order(tmp_path):
    path = write(tmp_path, [row(1), row(2), row(3)])
    instances, report = load_split(path, split="train", expected_rows=3)
    assert [i["instance_id"] for i in instances] == ["acme__widgets-1", "acme__widgets-2", "acme__widgets-3"]
    assert report.rows == 3 and report.shape == "raw" and report.repos == {"acme/widgets": 3}
    assert instances[0]["environment_setup_commit"] == instances[0]["base_commit"]


def test_skyrl_rows_are_unwrapped(tmp_path):
    rows = [
        {
            "data_source": "x",
            "prompt": [{"role": "user", "content": "c"}],
            "env_class": "swegym",
            "instance": row(i),
        }
        for i in (1, 2)
    ]
    instances, report = load_split(write(tmp_path, rows), split="train")
    assert report.shape == "skyrl"
    assert instances[1]["FAIL_TO_PASS"] == ["tests/test_w.py::test_2"]


def test_lists_given_as_json_strings_are_normalised(tmp_path):
    path = write(tmp_path, [row(1, FAIL_TO_PASS=json.dumps(["a::b"]), PASS_TO_PASS="[]")])
    (inst,), _ = load_split(path, split="train")
    assert inst["FAIL_TO_PASS"] == ["a::b"] and inst["PASS_TO_PASS"] == []


def test_numpy_arrays_from_pandas_are_normalised(tmp_path):
    import pandas as pd

    path = tmp_path / "pd.parquet"
    pd.DataFrame([row(1), row(2)]).to_parquet(path)
    instances, _ = load_split(path, split="train")
    assert instances[0]["FAIL_TO_PASS"] == ["tests/test_w.py::test_1"]
    assert type(instances[0]["PASS_TO_PASS"]) is list


def test_limit_applies_after_full_validation(tmp_path):
    path = write(tmp_path, [row(1), row(2), row(2)])
    with pytest.raises(DatasetError, match="duplicate"):
        load_split(path, split="train")
    instances, _ = load_split(write(tmp_path, [row(1), row(2)], "ok.parquet"), split="train")
    assert [i["instance_id"] for i in apply_limit(instances, 1)] == ["acme__widgets-1"]


@pytest.mark.parametrize(
    "rows, field, needle",
    [
        ([row(1), row(1)], "instance_id", "duplicate instance id"),
        ([row(1), row(2, FAIL_TO_PASS=[])], "FAIL_TO_PASS", "FAIL_TO_PASS is empty"),
        ([row(1, FAIL_TO_PASS="not json")], "FAIL_TO_PASS", "non-JSON string"),
        ([row(1, version=1.0)], "version", "expected a string, got float"),
        ([row(1, instance_id="nonsense")], "instance_id", "owner__repo-number"),
        ([row(1, base_commit="zzz")], "base_commit", "hex commit"),
        ([row(1, FAIL_TO_PASS=[1, 2])], "FAIL_TO_PASS", "as strings"),
    ],
)
def test_bad_rows_name_file_row_and_field(tmp_path, rows, field, needle):
    path = write(tmp_path, rows)
    with pytest.raises(DatasetError) as err:
        load_split(path, split="train")
    msg = str(err.value)
    assert "\n" not in msg
    assert str(path) in msg and f"field {field!r}" in msg and needle in msg
    assert f"row {len(rows) - 1}" in msg or f"row {0}" in msg


def test_missing_column_is_named(tmp_path):
    rows = [row(1), row(2)]
    for r in rows:
        del r["test_patch"]
    path = write(tmp_path, rows)
    with pytest.raises(DatasetError, match=r"row 0: field 'test_patch': required column is missing"):
        load_split(path, split="train")


def test_wrong_row_count_names_split_and_expectation(tmp_path):
    path = write(tmp_path, [row(1), row(2)])
    with pytest.raises(DatasetError, match=r"has 2 rows, expected 293") as err:
        load_split(path, split="train", expected_rows=293)
    assert "splits.train.rows" in str(err.value)


def test_malformed_parquet_is_one_line_and_no_report_left(tmp_path):
    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    report = tmp_path / "out" / "rows.report.json"
    with pytest.raises(DatasetError, match="not a readable parquet file") as err:
        validate_split(path, report, split="train", expected_rows=None)
    assert "\n" not in str(err.value)
    assert not report.exists()
    assert not list((tmp_path / "out").glob("*")) if (tmp_path / "out").exists() else True


def test_validate_split_report_is_byte_stable(tmp_path):
    path = write(tmp_path, [row(1), row(2)])
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    validate_split(path, a, split="train", expected_rows=2)
    validate_split(path, b, split="train", expected_rows=2)
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(a.read_text())["rows"] == 2


def test_pinned_sha_makes_no_network_call():
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert is_sha(sha)
    # an unroutable endpoint: any network call would fail, so returning proves no call was made
    assert resolve_revision("x/y", sha, endpoint="http://127.0.0.1:9") == sha


def test_unreachable_hub_is_one_clear_line():
    with pytest.raises(DatasetError) as err:
        resolve_revision("x/y", "main", endpoint="http://127.0.0.1:9", attempts=1, timeout=2)
    msg = str(err.value)
    assert "unreachable" in msg and "x/y" in msg and "\n" not in msg
