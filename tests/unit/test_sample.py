"""The embedded sample: deterministic repository, valid tasks, rows in both shapes, byte-stable parquet."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sweflow.errors import DatasetError
from sweflow.sample import (
    EXTRA_ID,
    HARNESS_EXT,
    HARNESS_PARSERS,
    HARNESS_SPECS,
    HISTORY,
    RAW_COLUMNS,
    SPLITS,
    apply_patch,
    clone_at,
    extra_task,
    instance_ids,
    load_task,
    materialize_repo,
    parquet_bytes,
    sample_rows,
    skyrl_rows,
    write_parquet,
    write_sample_dataset,
)
from sweflow.sample.generate import diff_of_edits, patched_files, pytest_log, run_pytest
from sweflow.sample.taskdefs import TASKS

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.fixture(scope="module")
def sample_repo(tmp_path_factory):
    return materialize_repo(tmp_path_factory.mktemp("sample") / "calclib")


def test_history_is_deterministic(sample_repo, tmp_path):
    again = materialize_repo(tmp_path / "again")
    assert again.commits == sample_repo.commits
    assert list(sample_repo.commits) == [c.name for c in HISTORY]
    assert len(set(sample_repo.commits.values())) == len(HISTORY) >= 3
    assert sample_repo.head == sample_repo.commits[HISTORY[-1].name]


def test_materialize_refuses_non_empty_destination(tmp_path):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(DatasetError, match="not empty"):
        materialize_repo(tmp_path)


def test_repository_is_clean_on_main(sample_repo):
    from sweflow.sample.repo import git

    assert git(sample_repo.path, "status", "--porcelain") == ""
    assert git(sample_repo.path, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert git(
        sample_repo.path, "log", "-1", "--format=%an <%ae> %cI", sample_repo.commits["initial"]
    ).strip() == ("Calclib Maintainers <maintainers@calclib.invalid> 2024-01-10T09:00:00+00:00")


@pytest.mark.parametrize("iid", instance_ids(None))
def test_task_fails_before_gold_and_passes_after(sample_repo, tmp_path, iid):
    row = load_task(iid)
    assert row["base_commit"] in sample_repo.commits.values()
    repo = clone_at(sample_repo.path, tmp_path / "repo", row["base_commit"])
    test_files = patched_files(row["test_patch"])
    assert apply_patch(repo, row["patch"], check_only=True), "gold patch does not apply at the base commit"
    assert apply_patch(repo, row["test_patch"])

    before = run_pytest(repo, test_files)  # the empty patch
    for t in row["FAIL_TO_PASS"]:
        assert before.get(t) != "PASSED", f"{t} passes without the fix"
    for t in row["PASS_TO_PASS"]:
        assert before.get(t) == "PASSED", f"{t} does not pass before the fix"

    assert apply_patch(repo, row["patch"])
    after = run_pytest(repo, test_files)
    for t in row["FAIL_TO_PASS"] + row["PASS_TO_PASS"]:
        assert after.get(t) == "PASSED", f"{t} does not pass with the gold patch"


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.instance_id)
def test_stored_patches_are_the_diffs_of_the_definitions(sample_repo, tmp_path, task):
    stored = load_task(task.instance_id)
    repo = clone_at(sample_repo.path, tmp_path / "repo", sample_repo.commits[task.base])
    assert diff_of_edits(repo, task.gold, task.instance_id) == stored["patch"]
    assert diff_of_edits(repo, task.tests, task.instance_id) == stored["test_patch"]
    assert stored["base_commit"] == sample_repo.commits[task.base]


def test_swebench_pytest_parser_reads_the_test_ids(sample_repo, tmp_path):
    log_parsers = pytest.importorskip("swebench.harness.log_parsers.python")
    parser = getattr(log_parsers, HARNESS_PARSERS["sweflow/calclib"])
    row = load_task("sweflow__calclib-7")  # parametrised ids with '-' and '.' in them
    repo = clone_at(sample_repo.path, tmp_path / "repo", row["base_commit"])
    assert apply_patch(repo, row["test_patch"])
    statuses = parser(pytest_log(repo, patched_files(row["test_patch"])), None)
    assert {t: statuses[t] for t in row["FAIL_TO_PASS"]} == dict.fromkeys(row["FAIL_TO_PASS"], "FAILED")
    assert {t: statuses[t] for t in row["PASS_TO_PASS"]} == dict.fromkeys(row["PASS_TO_PASS"], "PASSED")


def test_harness_specs_build_an_official_eval_script(monkeypatch):
    pytest.importorskip("swebench")
    from swebench.harness import constants
    from swebench.harness.test_spec.test_spec import make_test_spec

    for repo, versions in HARNESS_SPECS.items():
        monkeypatch.setitem(constants.MAP_REPO_VERSION_TO_SPECS, repo, versions)
        monkeypatch.setitem(constants.MAP_REPO_TO_EXT, repo, HARNESS_EXT[repo])
    row = load_task("sweflow__calclib-5")
    spec = make_test_spec(row)
    script = spec.eval_script
    assert "pytest -rA tests/test_stats.py" in script
    assert f"git checkout {row['base_commit']} tests/test_stats.py" in script
    assert spec.FAIL_TO_PASS == row["FAIL_TO_PASS"]


def test_rows_have_the_swegym_columns_and_splits():
    train, val = sample_rows("train"), sample_rows("validation")
    assert (len(train), len(val)) == (6, 2)
    ids = [r["instance_id"] for r in train + val]
    assert len(set(ids)) == 8 and EXTRA_ID not in ids
    for r in train + val + [extra_task()]:
        assert list(r) == list(RAW_COLUMNS)
        assert r["repo"] == "sweflow/calclib" and r["version"] == "0.1"
        assert r["instance_id"].startswith("sweflow__calclib-")
        assert r["environment_setup_commit"] == r["base_commit"]
        assert r["FAIL_TO_PASS"] and all(isinstance(t, str) for t in r["FAIL_TO_PASS"] + r["PASS_TO_PASS"])
        assert not set(r["FAIL_TO_PASS"]) & set(r["PASS_TO_PASS"])
        assert all(p.startswith("tests/") for p in patched_files(r["test_patch"]))
        assert not any(p.startswith("tests/") for p in patched_files(r["patch"]))
    assert len({r["base_commit"] for r in train + val}) >= 2
    assert len(sample_rows("train", extra=True)) == 7
    with pytest.raises(DatasetError, match="unknown sample split"):
        sample_rows("test")


def test_skyrl_rows_wrap_the_raw_rows():
    raw, sky = sample_rows("validation"), skyrl_rows("validation")
    for r, s in zip(raw, sky, strict=True):
        assert s["data_source"] == "sweflow/calclib-sample" and s["env_class"] == "swegym"
        assert s["prompt"] == [{"role": "user", "content": r["problem_statement"]}]
        assert s["instance"] == r


@pytest.mark.parametrize("shape", [sample_rows, skyrl_rows])
def test_parquet_is_byte_stable_and_round_trips(tmp_path, shape):
    rows = shape("train")
    a = write_parquet(rows, tmp_path / "a.parquet")
    b = write_parquet(shape("train"), tmp_path / "b.parquet")
    assert a.read_bytes() == b.read_bytes()
    assert pq.read_table(a).to_pylist() == rows
    assert parquet_bytes(rows) != parquet_bytes(shape("train", extra=True))


def test_write_sample_dataset(tmp_path):
    paths = write_sample_dataset(tmp_path, shape="raw")
    assert sorted(paths) == sorted(SPLITS)
    assert pq.read_table(Path(paths["validation"])).column("instance_id").to_pylist() == list(
        SPLITS["validation"]
    )
