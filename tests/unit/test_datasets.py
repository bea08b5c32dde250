"""Split reading and validation: both row shapes, list normalisation, and one-line errors for bad input."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sweflow.dataset.hub_client import is_sha, resolve_revision
from sweflow.dataset.splits import BadRowsError, apply_limit, load_split
from sweflow.errors import DatasetError
from sweflow.stages.data import validate_split


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
    # a column missing from the file is one line naming every row, not one line per row
    with pytest.raises(DatasetError, match=r"rows 0-1: field 'test_patch': required column is missing$"):
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


# ------------------------------------------------------------------ SWE-Gym-shaped rows, all bad rows at once

SWEGYM_REPOS = [
    "getmoto/moto",
    "python/mypy",
    "conan-io/conan",
    "iterative/dvc",
    "dask/dask",
    "pydantic/pydantic",
]


def swegym_row(i: int, **over):
    """A row with SWE-Gym's own columns and types (no environment_setup_commit; test lists as string lists)."""
    repo = SWEGYM_REPOS[i % len(SWEGYM_REPOS)]
    base = {
        "instance_id": f"{repo.replace('/', '__')}-{1000 + i}",
        "hints_text": "Looks like a regression in 4.1" if i % 2 else "",
        "patch": "diff --git a/src/x.py b/src/x.py\n--- a/src/x.py\n+++ b/src/x.py\n",
        "test_patch": "diff --git a/tests/test_x.py b/tests/test_x.py\n",
        "created_at": "2023-04-18T21:11:09Z",
        "problem_statement": f"`mock_s3` loses the ACL of object {i}\n\n```python\nimport boto3\n```\n",
        "repo": repo,
        "base_commit": f"{0xABCDEF0000 + i:040x}",
        "version": "4.1",
        "PASS_TO_PASS": [f"tests/test_x.py::test_ok_{i}", "tests/test_x.py::TestA::test_param[a-1]"],
        "FAIL_TO_PASS": [f"tests/test_x.py::test_fix_{i}"],
    }
    base.update(over)
    return base


def write_pandas(tmp_path, rows, name="train.parquet", json_lists=False):
    """The way SWE-Gym's parquet is made: pandas, lists as numpy arrays (or JSON strings, as SWE-bench stores them)."""
    import numpy as np
    import pandas as pd

    frame = pd.DataFrame(rows)
    for col in ("PASS_TO_PASS", "FAIL_TO_PASS"):
        frame[col] = [json.dumps(list(v)) if json_lists else np.array(v, dtype=object) for v in frame[col]]
    path = tmp_path / name
    frame.to_parquet(path)
    return path


@pytest.mark.parametrize("json_lists", [False, True], ids=["numpy-arrays", "json-strings"])
def test_every_bad_row_is_listed_in_one_error(tmp_path, json_lists):
    rows = [swegym_row(i) for i in range(8)]
    rows[2]["FAIL_TO_PASS"] = []
    rows[4]["base_commit"] = "not-a-sha"
    rows[4]["version"] = ""
    rows[5]["instance_id"] = rows[1]["instance_id"]
    rows[6]["problem_statement"] = "x" * 5000
    path = write_pandas(tmp_path, rows, json_lists=json_lists)
    with pytest.raises(BadRowsError) as err:
        load_split(path, split="train", max_problem_statement_chars=4000)
    lines = str(err.value).splitlines()
    assert lines[0] == f"{path}: 4 bad rows of 8 in split 'train', 5 problems (one per line below)"
    body = lines[1:]
    assert len(body) == 5 and all(ln.startswith(f"  {path}: row ") for ln in body)
    assert "row 2: field 'FAIL_TO_PASS': FAIL_TO_PASS is empty" in body[0]
    assert "row 4: field 'version': must not be empty" in body[1]
    assert "row 4: field 'base_commit'" in body[2] and "not-a-sha" in body[2]
    assert "row 5: field 'instance_id': duplicate instance id" in body[3] and "first seen in row 1" in body[3]
    assert "row 6: field 'problem_statement': 5000 characters, over the limit of 4000" in body[4]
    assert err.value.bad_rows == [2, 4, 5, 6]


def test_the_same_problem_in_many_rows_is_one_line_naming_them(tmp_path):
    import pandas as pd

    rows = [swegym_row(i) for i in range(6)]
    frame = pd.DataFrame(rows)
    frame["version"] = [4.1, 4.1, "4.1", 4.1, "4.1", 4.1]  # pandas writes a mixed column only as strings...
    frame["version"] = frame["version"].map(lambda v: v if isinstance(v, str) else None)  # ...so: nulls
    path = tmp_path / "train.parquet"
    frame.to_parquet(path)
    with pytest.raises(BadRowsError) as err:
        load_split(path, split="train")
    assert str(err.value) == f"{path}: rows 0-1, 3, 5: field 'version': is null, expected a string"


def test_swegym_rows_validate_with_numpy_arrays_and_json_strings(tmp_path):
    rows = [swegym_row(i) for i in range(6)]
    for json_lists in (False, True):
        path = write_pandas(tmp_path, rows, name=f"t{json_lists}.parquet", json_lists=json_lists)
        instances, report = load_split(path, split="train", max_problem_statement_chars=100_000)
        assert [i["instance_id"] for i in instances] == [r["instance_id"] for r in rows]
        assert instances[3]["PASS_TO_PASS"] == rows[3]["PASS_TO_PASS"]
        assert instances[0]["environment_setup_commit"] == rows[0]["base_commit"]
        assert report.repos == {r: 1 for r in SWEGYM_REPOS}


def test_problem_statement_limit_null_means_no_limit(tmp_path):
    path = write_pandas(tmp_path, [swegym_row(0, problem_statement="y" * 200_001)])
    (inst,), report = load_split(path, split="train", max_problem_statement_chars=None)
    assert len(inst["problem_statement"]) == 200_001
    with pytest.raises(BadRowsError, match=r"row 0: field 'problem_statement': 200001 characters, over"):
        load_split(path, split="train", max_problem_statement_chars=100_000)


def _invalid_utf8_string_column(values: list[bytes]):
    """A parquet *string* column holding bytes that are not UTF-8 (as a non-validating writer leaves them)."""
    b = pa.array(values, type=pa.binary())
    return pa.Array.from_buffers(pa.string(), len(b), b.buffers())


@pytest.mark.parametrize("kind", ["string-column", "binary-column"])
def test_invalid_utf8_is_one_line_naming_file_row_and_field(tmp_path, kind):
    rows = [swegym_row(i) for i in range(3)]
    table = pa.Table.from_pylist(rows)
    statements = [r["problem_statement"].encode() for r in rows]
    statements[1] = b"caf\xe9 au lait \xff"  # latin-1, not UTF-8
    col = table.schema.get_field_index("problem_statement")
    arr = (
        _invalid_utf8_string_column(statements)
        if kind == "string-column"
        else pa.array(statements, pa.binary())
    )
    table = table.set_column(col, "problem_statement", arr)
    path = tmp_path / "train.parquet"
    pq.write_table(table, path)
    with pytest.raises(DatasetError) as err:
        load_split(path, split="train")
    assert (
        str(err.value) == f"{path}: row 1: field 'problem_statement': not valid UTF-8: byte 0xe9 at offset 3"
    )


def test_valid_utf8_in_a_binary_column_is_read_as_text(tmp_path):
    rows = [swegym_row(i) for i in range(2)]
    table = pa.Table.from_pylist(rows)
    col = table.schema.get_field_index("hints_text")
    table = table.set_column(col, "hints_text", pa.array(["naïve ✓".encode(), b""], pa.binary()))
    pq.write_table(table, tmp_path / "train.parquet")
    instances, _ = load_split(tmp_path / "train.parquet", split="train")
    assert instances[0]["hints_text"] == "naïve ✓"


def test_invalid_utf8_inside_a_skyrl_instance_struct_is_named(tmp_path):
    rows = [swegym_row(i) for i in range(2)]
    inner = pa.Table.from_pylist(rows)
    col = inner.schema.get_field_index("repo")
    inner = inner.set_column(col, "repo", _invalid_utf8_string_column([b"getmoto/moto", b"python/\xc3("]))
    table = pa.table(
        {
            "data_source": ["swe-gym"] * 2,
            "instance": pa.StructArray.from_arrays(
                [c.combine_chunks() for c in inner.columns], inner.column_names
            ),
        }
    )
    pq.write_table(table, tmp_path / "train.parquet")
    with pytest.raises(DatasetError) as err:
        load_split(tmp_path / "train.parquet", split="train")
    assert str(err.value).endswith(
        "train.parquet: row 1: field 'repo': not valid UTF-8: byte 0xc3 at offset 7"
    )


def test_unpaired_surrogate_in_a_json_list_is_one_line(tmp_path):
    # SWE-bench stores the lists as JSON strings; a lone "\udc80" escape decodes to a str that is not UTF-8
    rows = [swegym_row(i) for i in range(2)]
    rows[1]["PASS_TO_PASS"] = ["tests/test_x.py::test_\udc80"]
    frame_rows = [
        {**r, "PASS_TO_PASS": json.dumps(r["PASS_TO_PASS"]), "FAIL_TO_PASS": json.dumps(r["FAIL_TO_PASS"])}
        for r in rows
    ]
    path = write(tmp_path, frame_rows)
    with pytest.raises(DatasetError) as err:
        load_split(path, split="train")
    assert str(err.value) == (
        f"{path}: row 1: field 'PASS_TO_PASS': not valid UTF-8 text: unpaired surrogate at character 22"
    )


def test_validate_split_writes_no_report_on_bad_rows_and_records_the_limit(tmp_path):
    path = write_pandas(tmp_path, [swegym_row(0), swegym_row(1, problem_statement="z" * 50)])
    out = tmp_path / "rows.report.json"
    with pytest.raises(BadRowsError):
        validate_split(path, out, split="train", expected_rows=2, max_problem_statement_chars=40)
    assert not out.exists()
    validate_split(path, out, split="train", expected_rows=2, max_problem_statement_chars=100_000)
    assert json.loads(out.read_text())["max_problem_statement_chars"] == 100_000


def test_bad_rows_error_redacts_url_credentials(tmp_path):
    rows = [swegym_row(i) for i in range(3)]
    rows[0]["base_commit"] = "https://user:hf_abcdefghijklmnopqrstuvwxyz0123@example.invalid/x"
    rows[2]["FAIL_TO_PASS"] = []
    path = write_pandas(tmp_path, rows)
    with pytest.raises(BadRowsError) as err:
        load_split(path, split="train")
    msg = str(err.value)
    assert len(msg.splitlines()) == 3 and "row 0: field 'base_commit'" in msg
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in msg and "user:" not in msg
