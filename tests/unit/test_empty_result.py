"""A stage that made nothing usable (0 templates, 0 rows converted, 0 tasks valid) ends the run with one line
naming the stage, the count, the most common reason and what to do, and writes nothing; `allow_empty` says
when that is expected (issue 45, point 7: the Docker rung without its images ended "100% done")."""

from __future__ import annotations

import json

import pytest

from sweflow.errors import EmptyResultError
from sweflow.rulekit import check_not_empty, empty_allowed, step
from sweflow.sample import sample_rows, write_parquet
from sweflow.stages import data
from sweflow.stages.validate import summarize
from sweflow.util import jsonl_line

PREFIX = "xingyaoww/sweb.eval.x86_64."


def missing_image_failure(image: str) -> dict:
    """The record build_template writes for a task image Docker does not have (sweflow.sandbox.build)."""
    return {
        "image": image,
        "provider": "docker",
        "ok": False,
        "step": "FROM",
        "error": f"{image}: field 'FROM': task image not found (build or load it first)",
    }


def build_records(tmp_path, images):
    paths = []
    for n, image in enumerate(images):
        p = tmp_path / f"rec{n}.json"
        p.write_text(json.dumps(missing_image_failure(image)))
        paths.append(str(p))
    return paths


def assert_one_line(exc: EmptyResultError, *parts: str) -> str:
    line = exc.one_line()
    assert "\n" not in line
    for part in parts:
        assert part in line, (part, line)
    return line


def test_no_template_fails_naming_the_missing_image_and_the_pull(tmp_path):
    images = [f"{PREFIX}o_s_r-{i}:latest" for i in range(3)]
    out_map, out_fail = tmp_path / "template-map.json", tmp_path / "template-failures.json"
    with pytest.raises(EmptyResultError) as err:
        data.template_map(
            build_records(tmp_path, images), out_map, out_fail, listing="results/swegym/images.txt"
        )
    assert_one_line(
        err.value,
        "template_map: 0 of 3 images have a template",
        "most common reason (3 of 3): FROM: <image>: field 'FROM': task image not found",
        f"pull the images: docker pull {images[0]}",
        "xargs -n1 docker pull < results/swegym/images.txt",
        "allow_empty: [template_map]",
    )
    assert not out_map.exists() and not out_fail.exists(), "nothing half-written"


def test_no_template_passes_when_allow_empty_names_the_stage(tmp_path):
    images = [f"{PREFIX}o_s_r-1:latest"]
    for allow in (["template_map"], True):
        mapping, failures = data.template_map(
            build_records(tmp_path, images), tmp_path / "m.json", tmp_path / "f.json", allow_empty=allow
        )
        assert mapping == {} and list(failures) == images
        assert json.loads((tmp_path / "m.json").read_text()) == {}
    with pytest.raises(EmptyResultError):  # another stage named: this one still fails
        data.template_map(
            build_records(tmp_path, images), tmp_path / "m.json", tmp_path / "f.json", allow_empty=["convert"]
        )


def convert(tmp_path, harness, failures, **kw):
    rows = sample_rows("train")
    write_parquet(rows, tmp_path / "train.parquet")
    (tmp_path / "map.json").write_text("{}")
    (tmp_path / "fail.json").write_text(json.dumps(failures(rows)))
    opts = data.convert_options(
        dataset="sample",
        split="train",
        provider="docker",
        harness_cfg={"package": "swebench"},
        agent_cfg={"backend_options": {}},
        naming_cfg={"prefix": PREFIX},
        sandbox_timeout_sec=3600,
        harness=harness,
    )
    out, report = tmp_path / "train.jsonl", tmp_path / "train.convert.json"
    res = data.convert(
        tmp_path / "train.parquet", tmp_path / "map.json", tmp_path / "fail.json", out, report,
        opts=opts, harness=harness, **kw,
    )  # fmt: skip
    return rows, out, report, res


def all_images_missing(rows):
    from sweflow.dataset.image_names import ImageNaming

    naming = ImageNaming(prefix=PREFIX)
    out = {}
    for r in rows:
        image = naming.image_for(r["instance_id"], r["repo"])
        rec = missing_image_failure(image)
        out[image] = f"{rec['step']}: {rec['error']}"
    return out


def test_an_empty_conversion_fails_with_one_line_and_writes_nothing(tmp_path, harness):
    with pytest.raises(EmptyResultError) as err:
        convert(tmp_path, harness, all_images_missing, listing="results/sample/images.txt")
    n = len(sample_rows("train"))
    line = assert_one_line(
        err.value,
        f"convert: 0 of {n} rows of split train converted",
        f"most common reason ({n} of {n}): FROM: <image>: field 'FROM': task image not found",
        f"pull the images: docker pull {PREFIX}",
        "allow_empty: [convert]",
    )
    assert line.count("docker pull") == 2  # one image, then the listing
    assert not (tmp_path / "train.jsonl").exists() and not (tmp_path / "train.convert.json").exists()


def test_an_empty_conversion_passes_with_the_opt_out(tmp_path, harness):
    rows, out, report, res = convert(tmp_path, harness, all_images_missing, allow_empty=["convert"])
    assert out.read_text() == "" and res["rows"] == 0 and len(res["skipped"]) == len(rows)


def verdicts_for(tmp_path, verdicts):
    rows = sample_rows("train")[: len(verdicts)]
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(jsonl_line({"metadata": {"instance_id": r["instance_id"]}}) for r in rows))
    results = []
    for r, (verdict, reason) in zip(rows, verdicts, strict=True):
        p = tmp_path / f"{r['instance_id']}.json"
        p.write_text(json.dumps({"instance_id": r["instance_id"], "verdict": verdict, "reason": reason}))
        results.append(p)
    return jsonl, results


def test_no_valid_task_fails_naming_the_most_common_verdict(tmp_path):
    jsonl, results = verdicts_for(
        tmp_path,
        [("gold_fails", "fail_to_pass_failure"), ("gold_fails", "fail_to_pass_failure"), ("flaky", None),
         ("error", "sandbox_lost: template image not found")],
    )  # fmt: skip
    with pytest.raises(EmptyResultError) as err:
        summarize(
            jsonl, results, tmp_path / "s.json", tmp_path / "valid.jsonl", split="train", reopen_errors=True
        )
    line = assert_one_line(
        err.value,
        "validation_summary: 0 of 4 tasks of split train valid",
        "most common reason (2 of 4): gold_fails: fail_to_pass_failure",
        "allow_empty: [validation_summary]",
    )
    assert "docker pull" not in line
    assert not (tmp_path / "s.json").exists() and not (tmp_path / "valid.jsonl").exists()
    assert [p.exists() for p in results] == [True, True, True, False], "the error task is validated again"


def test_no_valid_task_passes_with_the_opt_out(tmp_path):
    jsonl, results = verdicts_for(tmp_path, [("gold_fails", "fail_to_pass_failure")])
    s = summarize(jsonl, results, tmp_path / "s.json", tmp_path / "valid.jsonl", allow_empty=True)
    assert s["valid"] == 0 and (tmp_path / "valid.jsonl").read_text() == ""


def test_the_rule_prints_the_one_line_and_exits_non_zero(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        with step("template_map", outputs=[], log_file=str(tmp_path / "log"), provenance=False):
            data.template_map(
                build_records(tmp_path, [f"{PREFIX}o_s_r-1:latest"]), tmp_path / "m.json", tmp_path / "f.json"
            )
    assert exited.value.code == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sweflow: ")]
    assert len(err) == 1 and err[0].startswith("sweflow: template_map: 0 of 1 images have a template; ")
    assert "pull the images: docker pull" in err[0] and "Traceback" not in err[0]


def test_a_stage_with_items_left_passes_and_allow_empty_reads_true_or_names():
    check_not_empty("convert", kept=1, total=2, what="rows", reasons=[("", "x")], allow_empty=False)
    assert empty_allowed(True, "convert") and empty_allowed(["convert"], "convert")
    assert not empty_allowed(False, "convert") and not empty_allowed(["template_map"], "convert")
    with pytest.raises(EmptyResultError, match="the stage before it passed on nothing"):
        check_not_empty("convert", kept=0, total=0, what="rows", reasons=[], allow_empty=None)
