"""Training rows from the sample tasks with the real harness package (swebench 4.x)."""

from __future__ import annotations

import base64
import gzip
import json
import re

import pytest

from sweflow.dataset.convert import INTEGRITY_RULES
from sweflow.dataset.image_names import ImageNaming
from sweflow.dataset.splits import BadRowsError
from sweflow.errors import DatasetError
from sweflow.sample import sample_rows, write_parquet
from sweflow.stages import data

PREFIX = "sweflow-sample/sweb.eval.x86_64."


def options(harness, **over):
    return data.convert_options(
        dataset="sample",
        split="train",
        provider="docker",
        harness_cfg={"package": "swebench"},
        agent_cfg={"backend_options": {"max_turns": 80, "permission_mode": "acceptEdits"}},
        naming_cfg={"prefix": PREFIX},
        sandbox_timeout_sec=3600,
        harness=harness,
        **over,
    )


def full_map(rows):
    naming = ImageNaming(prefix=PREFIX)
    return {naming.image_for(r["instance_id"], r["repo"]): f"tpl-{i}" for i, r in enumerate(rows)}


def convert_files(tmp_path, harness, rows, mapping, failures=None, name="train"):
    pq = tmp_path / f"{name}.parquet"
    write_parquet(rows, pq)
    (tmp_path / "map.json").write_text(json.dumps(mapping))
    (tmp_path / "fail.json").write_text(json.dumps(failures or {}))
    out = tmp_path / f"{name}.jsonl"
    report = data.convert(
        pq,
        tmp_path / "map.json",
        tmp_path / "fail.json",
        out,
        tmp_path / f"{name}.report.json",
        opts=options(harness),
        harness=harness,
    )
    return out, report


def test_rows_carry_everything_but_the_gold_patch(tmp_path, harness):
    rows = sample_rows("train")
    out, report = convert_files(tmp_path, harness, rows, full_map(rows))
    lines = out.read_text().splitlines()
    assert report["rows"] == len(rows) == len(lines)
    for raw, line in zip(rows, lines, strict=True):
        row = json.loads(line)
        assert json.dumps(raw["patch"].strip())[1:-1] not in line  # as the JSONL would hold it
        assert row["label"] == ""
        assert row["prompt"][0]["role"] == "user"
        assert row["prompt"][0]["content"].startswith(raw["problem_statement"].rstrip())
        assert INTEGRITY_RULES.splitlines()[0] in row["prompt"][0]["content"]
        md = row["metadata"]
        assert md["instance_id"] == raw["instance_id"] and md["base_commit"] == raw["base_commit"]
        assert md["FAIL_TO_PASS"] == raw["FAIL_TO_PASS"] and md["PASS_TO_PASS"] == raw["PASS_TO_PASS"]
        assert md["sandbox_image"].startswith("tpl-") and md["docker_image"].startswith(PREFIX)
        assert md["backend_options"] == {
            "working_directory": "/testbed",
            "max_turns": 80,
            "permission_mode": "acceptEdits",
        }
        assert md["harness"]["package"] == "swebench" and md["harness"]["version"].startswith("4.")
        before = md["blackbox_execute_cmds"]["before_agent"][0]
        assert before["required"] is True and raw["base_commit"] in before["cmd"]
        after = md["blackbox_execute_cmds"]["after_agent"][0]
        assert after["timeout"] == 1260


def test_a_gold_patch_quoted_in_the_problem_statement_fails_the_split(tmp_path, harness):
    rows = sample_rows("train")
    leaky = dict(rows[1])
    assert "\n" in leaky["patch"].strip()  # multi-line: in the JSONL its newlines are escaped
    leaky["problem_statement"] += "\n\nThe fix:\n" + leaky["patch"]
    with pytest.raises(DatasetError, match="gold patch leaked") as err:
        convert_files(tmp_path, harness, [rows[0], leaky], full_map(rows))
    assert err.value.row == leaky["instance_id"] and err.value.field == "patch"
    assert not (tmp_path / "train.jsonl").exists()  # nothing half-written


def test_evaluator_embeds_the_official_eval_script_with_the_test_patch(tmp_path, harness):
    rows = sample_rows("train")[:1]
    out, _ = convert_files(tmp_path, harness, rows, full_map(rows))
    cmd = json.loads(out.read_text())["metadata"]["blackbox_execute_cmds"]["after_agent"][0]["cmd"]
    blobs = [
        gzip.decompress(base64.b64decode(b)).decode() for b in re.findall(r"'(H4sI[A-Za-z0-9+/=]+)'", cmd)
    ]
    official = harness.eval_script(rows[0])
    assert any(official.strip().splitlines()[-1] in b for b in blobs)
    # the test patch is applied by the official script inside the evaluator, never shown to the agent
    assert any(rows[0]["test_patch"].splitlines()[0] in b for b in blobs)


def test_output_is_byte_identical_on_rerun(tmp_path, harness):
    rows = sample_rows("train")
    a, _ = convert_files(tmp_path, harness, rows, full_map(rows))
    first = a.read_bytes()
    b, _ = convert_files(tmp_path, harness, rows, full_map(rows))
    assert b.read_bytes() == first


def test_images_missing_from_map_are_all_named_in_one_error(tmp_path, harness):
    rows = sample_rows("train")
    mapping = full_map(rows)
    gone = list(mapping)[2:4]
    for image in gone:
        del mapping[image]
    with pytest.raises(DatasetError) as err:
        convert_files(tmp_path, harness, rows, mapping)
    lines = str(err.value).splitlines()
    assert lines[0].endswith(f"2 bad rows of {len(rows)} for conversion, 2 problems (one per line below)")
    assert "row 2: field 'sandbox_image'" in lines[1] and gone[0] in lines[1]
    assert "row 3: field 'sandbox_image'" in lines[2] and gone[1] in lines[2]
    assert not (tmp_path / "train.jsonl").exists()


def test_failed_template_builds_are_skipped_and_reported(tmp_path, harness):
    rows = sample_rows("train")
    mapping = full_map(rows)
    broken = list(mapping)[0]
    del mapping[broken]
    out, report = convert_files(tmp_path, harness, rows, mapping, failures={broken: "docker_build: exit 1"})
    assert report["rows"] == len(rows) - 1
    assert report["skipped"] == [
        {
            "file": str(tmp_path / "train.parquet"),
            "row": 0,
            "field": "sandbox_image",
            "image": broken,
            "instance_id": rows[0]["instance_id"],
            "reason": "docker_build: exit 1",
        }
    ]


def test_rows_the_harness_cannot_handle_are_skipped_and_the_others_convert(tmp_path, harness):
    rows = sample_rows("train")
    rows[3] = {**rows[3], "repo": "acme/unknown", "instance_id": "acme__unknown-1"}
    rows[1] = {**rows[1], "version": "9.9"}
    out, report = convert_files(tmp_path, harness, rows, full_map(rows))
    converted = [json.loads(line)["metadata"]["instance_id"] for line in out.read_text().splitlines()]
    assert converted == [r["instance_id"] for i, r in enumerate(rows) if i not in (1, 3)]
    assert report["rows"] == len(rows) - 2
    skipped = {s["row"]: s for s in report["skipped"]}
    assert sorted(skipped) == [1, 3]
    assert skipped[3]["instance_id"] == "acme__unknown-1" and skipped[3]["field"] == "repo"
    assert "acme/unknown" in skipped[3]["reason"] and skipped[3]["reason"].startswith("harness: ")
    assert "9.9" in skipped[1]["reason"] and skipped[1]["file"] == str(tmp_path / "train.parquet")
    assert all("\n" not in s["reason"] for s in report["skipped"])
    # the report on disk is what was returned
    assert json.loads((tmp_path / "train.report.json").read_text()) == report


def test_a_harness_that_can_handle_no_row_fails_the_split_listing_every_row(tmp_path, harness):
    rows = [{**r, "version": "9.9"} for r in sample_rows("train")]
    with pytest.raises(BadRowsError) as err:
        convert_files(tmp_path, harness, rows, full_map(rows))
    msg = str(err.value)
    assert "\n" not in msg and msg.endswith(
        "(the harness could convert no row: check harness.package and harness.extra_repos)"
    )
    assert f"train.parquet: rows 0-{len(rows) - 1}: field 'version': harness: version '9.9'" in msg
    assert not (tmp_path / "train.jsonl").exists()
