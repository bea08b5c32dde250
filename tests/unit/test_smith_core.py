"""SWE-smith core without sandboxes: ids and shards, profiles (and their one-line errors), the k-run
stability rule, reference verdicts, the patch helpers."""

from __future__ import annotations

import pytest

from sweflow.errors import SmithError
from sweflow.smith.bug_validation import SuiteResult, SuiteRun, classify, reference_verdict, stable_statuses
from sweflow.smith.candidates import candidate_id, make_candidate, read_candidates, shard_of, write_jsonl
from sweflow.smith.gather import files_of_tests
from sweflow.smith.gitrepo import applies, checkout, file_patch, is_test_path, patch_files, worktree_diff
from sweflow.smith.profile import load_profile

SHA = "fe92ce32ae4a5edd1a5f11e4211b43c3514840ea"


def test_ids_name_repo_commit_strategy_and_diff_hash():
    a = candidate_id("sweflow/calclib", SHA, "procedural", "diff 1")
    assert a.startswith("sweflow__calclib.fe92ce32.procedural__") and len(a.rsplit("__", 1)[1]) == 8
    assert a == candidate_id("sweflow/calclib", SHA, "procedural", "diff 1")
    assert a != candidate_id("sweflow/calclib", SHA, "procedural", "diff 2")
    assert candidate_id("sweflow/calclib", SHA, "combine", "diff 1").endswith(a.rsplit("__", 1)[1])
    with pytest.raises(SmithError, match="unknown strategy"):
        candidate_id("sweflow/calclib", SHA, "magic", "x")
    with pytest.raises(SmithError, match="owner/name"):
        candidate_id("calclib", SHA, "procedural", "x")


def test_shards_are_stable_and_cover_every_key():
    keys = [f"calclib/f{i}.py::fn" for i in range(200)]
    got = [shard_of(k, 4) for k in keys]
    assert got == [shard_of(k, 4) for k in keys] and set(got) == {0, 1, 2, 3}
    assert all(shard_of(k, 1) == 0 for k in keys)


def test_candidate_shards_round_trip(tmp_path):
    c = make_candidate("sweflow/calclib", SHA, "procedural", "diff", ["b.py", "a.py"], entity="a.py::f")
    write_jsonl(tmp_path / "s.jsonl", [c.to_dict()])
    assert read_candidates(tmp_path / "s.jsonl") == [c] and c.files == ("a.py", "b.py")
    (tmp_path / "bad.jsonl").write_text('{"instance_id": "x"}\n')
    with pytest.raises(SmithError, match=r"bad.jsonl: row 1: candidate lacks"):
        read_candidates(tmp_path / "bad.jsonl")


def test_profiles_load_and_bad_ones_name_the_field(tmp_path):
    p = load_profile("sample")
    assert (p.repo, p.test_cmd, p.log_parser, p.timeout_sec, p.min_pass_share) == (
        "sweflow/calclib", "pytest -rA --continue-on-collection-errors", "parse_log_pytest", 90, 0.8)  # fmt: skip
    f = tmp_path / "prof.yaml"
    f.write_text("name: lib\nrepo: me/lib\nsource: src\ninstall: pip install -e .\nmin_pass_share: 0.5\n")
    q = load_profile("prof.yaml", base=tmp_path)
    assert q.install == ("pip install -e .",) and q.source == str(tmp_path / "src")
    assert q.harness_spec()["me/lib"]["0.1"]["test_cmd"] == "pytest -rA --continue-on-collection-errors"
    f.write_text("name: lib\nrepo: me/lib\nsource: src\ntest_command: x\n")
    with pytest.raises(SmithError, match=r"prof.yaml: field 'test_command': unknown key"):
        load_profile("prof.yaml", base=tmp_path)
    with pytest.raises(SmithError, match=r"field 'repo'"):
        load_profile({"name": "x", "source": "sample"})
    for bad in ({"min_pass_share": 0}, {"min_pass_share": "lots"}, {"install": [1]}, {"timeout_sec": -5},
                {"test_cmd": ["pytest"]}):  # fmt: skip
        with pytest.raises(SmithError, match=rf"field '{next(iter(bad))}'"):
            load_profile({"name": "x", "repo": "a/b", "source": "s", **bad})


def test_stability_rule_keeps_flaky_tests_out_of_f2p_and_p2p():
    ref = ["t::a", "t::b", "t::c", "t::d"]
    bug = [
        {"t::a": "FAILED", "t::b": "PASSED", "t::c": "FAILED", "t::d": "PASSED"},
        {"t::a": "FAILED", "t::b": "PASSED", "t::c": "PASSED"},  # c flips, d vanishes
    ]
    assert classify(ref, bug) == {
        "FAIL_TO_PASS": ["t::a"],
        "PASS_TO_PASS": ["t::b"],
        "flaky": ["t::c", "t::d"],
    }
    # absent in every bug run is a stable non-pass (a collection error), so FAIL_TO_PASS
    assert classify(["t::a"], [{}, {}])["FAIL_TO_PASS"] == ["t::a"]
    # SKIPPED / XFAIL / ERROR are never passes
    assert classify(["t::a", "t::b"], [{"t::a": "SKIPPED", "t::b": "ERROR"}] * 2)["FAIL_TO_PASS"] == [
        "t::a", "t::b"]  # fmt: skip
    stable, flaky = stable_statuses([{"x": "PASSED", "y": "SKIPPED"}, {"x": "PASSED", "y": "PASSED"}])
    assert stable == {"x": "PASSED"} and flaky == ["y"]


def _runs(*maps, timed_out=False):
    return SuiteResult([SuiteRun(dict(m), 0, timed_out, 1.0) for m in maps])


def test_reference_verdicts():
    prof = load_profile("sample")
    ok = reference_verdict(_runs({"a": "PASSED", "b": "PASSED"}, {"a": "PASSED", "b": "PASSED"}), prof)
    assert ok["ok"] and ok["passed"] == ["a", "b"] and ok["share"] == 1.0
    # a flaky reference test is not a pass (4 of 5 stable passes = 80% is still enough)
    five = {k: "PASSED" for k in "abcde"}
    flaky = reference_verdict(_runs(five, {**five, "e": "FAILED"}), prof)
    assert flaky["ok"] and flaky["flaky"] == ["e"] and "e" not in flaky["passed"]
    low = reference_verdict(_runs({"a": "PASSED", "b": "FAILED"}, {"a": "PASSED", "b": "FAILED"}), prof)
    assert not low["ok"] and "50% of 2 tests pass" in low["reason"]
    none = reference_verdict(_runs({}, {}), prof)
    assert not none["ok"] and "found no tests" in none["reason"]
    slow = reference_verdict(_runs({"a": "PASSED"}, timed_out=True), prof)
    assert not slow["ok"] and "timeout" in slow["reason"]


def test_test_paths_and_test_files():
    assert is_test_path("tests/test_x.py") and is_test_path("pkg/x_test.py") and is_test_path("conftest.py")
    assert is_test_path("specs/helpers.py") and is_test_path("pkg/tests.py")
    assert not is_test_path("calclib/stats.py") and not is_test_path("pkg/latest.py")
    assert files_of_tests(["tests/a.py::t[1]", "tests/a.py::u", "tests/b.py::C::t"]) == [
        "tests/a.py",
        "tests/b.py",
    ]


def test_file_patch_applies_with_and_without_final_newline(tmp_path):
    from sweflow.sample import materialize_repo

    info = materialize_repo(tmp_path / "r")
    tree = checkout(info.path, info.head, tmp_path / "w")
    old = (tree / "calclib/units.py").read_text()
    for new in (old.replace("def ", "def  ", 1), old + "x = 1", old.rstrip("\n")):
        p = file_patch("calclib/units.py", old, new)
        assert applies(tree, p) and patch_files(p) == ["calclib/units.py"]
    assert file_patch("a.py", "x\n", "x\n") == ""
    (tree / "calclib/units.py").write_text(old + "# end\n")
    assert "+# end" in worktree_diff(tree)
