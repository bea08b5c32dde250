"""convert_split with worker processes: the same lines in the same order, skips and errors with global rows."""

from __future__ import annotations

import pickle

import pytest

from sweflow.dataset import convert as conv
from sweflow.dataset.image_names import ImageNaming
from sweflow.dataset.splits import BadRowsError, RowProblem
from sweflow.errors import DatasetError
from sweflow.sample import numbered_rows
from sweflow.stages import data

PREFIX = "sweflow-sample/sweb.eval.x86_64."


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(conv, "MIN_ROWS_PER_WORKER", 2)  # fork even for a handful of rows


def rows(n: int) -> list[dict]:
    return numbered_rows(n, first=9000)


def run(harness, insts, *, workers, mapping=None, failed=None):
    naming = ImageNaming(prefix=PREFIX)
    if mapping is None:
        mapping = {naming.image_for(r["instance_id"], r["repo"]): f"tpl-{i}" for i, r in enumerate(insts)}
    opts = data.convert_options(
        dataset="sample",
        split="train",
        provider="docker",
        harness_cfg={"package": "swebench"},
        agent_cfg={"backend_options": {"max_turns": 80}},
        naming_cfg={"prefix": PREFIX},
        sandbox_timeout_sec=3600,
        harness=harness,
    )
    return conv.convert_split(
        insts,
        template_map=mapping,
        failed_images=failed or {},
        harness=harness,
        opts=opts,
        source_file="train.parquet",
        workers=workers,
    )


def forks(monkeypatch) -> list[int]:
    """Records how many worker processes each forked conversion used."""
    seen: list[int] = []
    real = conv._convert_forked

    def spy(instances, n, args):
        seen.append(n)
        return real(instances, n, args)

    monkeypatch.setattr(conv, "_convert_forked", spy)
    return seen


def test_workers_give_the_same_lines_in_row_order(harness, small_chunks, monkeypatch):
    insts = rows(9)
    one = run(harness, insts, workers=1)
    seen = forks(monkeypatch)
    three = run(harness, insts, workers=3)
    assert seen == [3]
    assert three.lines == one.lines and len(one.lines) == 9
    assert [r["metadata"]["instance_id"] for r in three.rows] == [r["instance_id"] for r in insts]


def test_few_rows_stay_in_one_process(harness, monkeypatch):
    seen = forks(monkeypatch)
    assert len(run(harness, rows(5), workers=4).lines) == 5
    assert seen == []  # under MIN_ROWS_PER_WORKER rows per worker: no fork


def test_skips_in_a_later_chunk_name_their_row_in_the_split(harness, small_chunks):
    insts = rows(8)
    naming = ImageNaming(prefix=PREFIX)
    images = [naming.image_for(r["instance_id"], r["repo"]) for r in insts]
    mapping = {img: "tpl" for k, img in enumerate(images) if k != 6}
    res = run(harness, insts, workers=2, mapping=mapping, failed={images[6]: "build: no space left"})
    assert [(s["row"], s["instance_id"], s["reason"]) for s in res.skipped] == [
        (6, insts[6]["instance_id"], "build: no space left")
    ]
    assert len(res.lines) == 7


def test_images_missing_in_several_chunks_are_one_error_with_their_rows(harness, small_chunks):
    insts = rows(8)
    naming = ImageNaming(prefix=PREFIX)
    mapping = {
        naming.image_for(r["instance_id"], r["repo"]): "t" for k, r in enumerate(insts) if k not in (1, 7)
    }
    with pytest.raises(BadRowsError) as err:
        run(harness, insts, workers=2, mapping=mapping)
    assert err.value.bad_rows == [1, 7] and err.value.total_rows == 8


def test_a_gold_patch_in_a_worker_fails_with_its_row_and_field(harness, small_chunks):
    insts = rows(8)
    insts[5]["problem_statement"] += "\n" + insts[5]["patch"]
    with pytest.raises(DatasetError, match="gold patch leaked") as err:
        run(harness, insts, workers=2)
    assert err.value.row == insts[5]["instance_id"] and err.value.field == "patch"


def test_errors_cross_a_process_boundary_whole():
    err = DatasetError("bad value", file="train.parquet", row=3, field="version", hint="fix it")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is DatasetError and str(back) == str(err)
    assert (back.file, back.row, back.field, back.hint) == ("train.parquet", 3, "version", "fix it")
    many = BadRowsError([RowProblem("x", row=1, field="f"), RowProblem("y", row=4)], file="a", total_rows=9)
    back = pickle.loads(pickle.dumps(many))
    assert back.bad_rows == [1, 4] and back.lines() == many.lines() and str(back) == str(many)


def test_a_worker_that_dies_fails_the_step_instead_of_hanging(harness, small_chunks, monkeypatch):
    import os
    from concurrent.futures.process import BrokenProcessPool

    real = conv._convert_rows

    def dies_on_the_second_run(instances, offset, *args):
        if offset > 0:
            os._exit(137)  # as if killed by the OOM killer
        return real(instances, offset, *args)

    monkeypatch.setattr(conv, "_convert_rows", dies_on_the_second_run)
    with pytest.raises(BrokenProcessPool):
        run(harness, rows(8), workers=2)
