"""The convert step builds each repo's standalone parser program once, and the cached text is the same text.

No timing here: the speed figures live in benchmarks/bench_convert.py.
"""

from __future__ import annotations

import pytest

from sweflow.dataset.convert import convert_split
from sweflow.dataset.image_names import ImageNaming
from sweflow.errors import HarnessError
from sweflow.harness import standalone, unpack_command
from sweflow.sample import sample_rows
from sweflow.stages import data

PREFIX = "sweflow-sample/sweb.eval.x86_64."
CALCLIB = "sweflow/calclib"


@pytest.fixture
def builds(monkeypatch):
    """Cold caches, and a list that gets one entry per program actually built (an _Inliner made)."""
    made: list[str] = []

    class CountingInliner(standalone._Inliner):
        def __init__(self, package: str) -> None:
            made.append(package)
            super().__init__(package)

    standalone._parser_program.cache_clear()
    standalone._pack_program.cache_clear()
    monkeypatch.setattr(standalone, "_Inliner", CountingInliner)
    yield made
    standalone._parser_program.cache_clear()
    standalone._pack_program.cache_clear()


def uncached_program(harness, repo: str) -> str:
    """The program built from scratch, bypassing the cache."""
    parser = harness.parser_for(repo)
    return standalone._parser_program.__wrapped__(
        harness.package, repo, parser, harness.start_marker, harness.end_marker
    )


def test_rows_of_one_repo_build_the_parser_program_once(harness, builds):
    rows = sample_rows("train")[:2]
    assert {r["repo"] for r in rows} == {CALCLIB}
    commands = [harness.evaluator_command(r) for r in rows]
    assert len(builds) == 1
    expected = uncached_program(harness, CALCLIB)
    assert len(builds) == 2  # the uncached construction really builds
    for cmd in commands:
        assert unpack_command(cmd)[standalone.PARSER_FILE] == expected
    assert harness.standalone_parser_source(CALCLIB) == expected
    assert len(builds) == 2


def test_the_convert_step_builds_one_program_per_repo(harness, builds):
    rows = sample_rows("train")
    naming = ImageNaming(prefix=PREFIX)
    opts = data.convert_options(
        dataset="sample",
        split="train",
        provider="docker",
        harness_cfg={"package": "swebench"},
        agent_cfg={},
        naming_cfg={"prefix": PREFIX},
        sandbox_timeout_sec=3600,
        harness=harness,
    )
    result = convert_split(
        rows,
        template_map={naming.image_for(r["instance_id"], r["repo"]): "tpl" for r in rows},
        failed_images={},
        harness=harness,
        opts=opts,
        source_file="train.parquet",
    )
    assert len(result.rows) == len(rows) > 1 and not result.skipped
    assert len(builds) == 1
    expected = uncached_program(harness, CALCLIB)
    for row in result.rows:
        cmd = row["metadata"]["blackbox_execute_cmds"]["after_agent"][0]["cmd"]
        assert unpack_command(cmd)[standalone.PARSER_FILE] == expected


def test_each_repo_and_parser_has_its_own_program(harness, builds):
    calclib = harness.standalone_parser_source(CALCLIB)
    astropy = harness.standalone_parser_source("astropy/astropy")
    assert len(builds) == 2 and calclib != astropy
    # the same repo with another parser (an explicit override) is another program, built once
    other = harness.parser_for("astropy/astropy")
    overridden = standalone.standalone_parser_source(harness, CALCLIB, other)
    assert standalone.standalone_parser_source(harness, CALCLIB, other) == overridden != calclib
    assert len(builds) == 3
    assert astropy == uncached_program(harness, "astropy/astropy")


def test_the_cached_command_equals_a_cold_one(harness, builds):
    inst = sample_rows("train")[0]
    warm_up = harness.evaluator_command(inst)
    standalone._parser_program.cache_clear()
    standalone._pack_program.cache_clear()
    assert harness.evaluator_command(inst) == warm_up
    assert harness.evaluator_command(inst) == warm_up


def test_a_parser_that_cannot_be_inlined_still_fails_each_time(harness, builds):
    class Unhashable:
        __name__ = "unhashable_parser"
        __hash__ = None

        def __call__(self, log):
            return {}

    for _ in range(2):
        with pytest.raises(HarnessError, match="cannot inline"):
            standalone.standalone_parser_source(harness, CALCLIB, Unhashable())
