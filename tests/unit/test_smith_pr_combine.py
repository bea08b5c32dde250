"""PR mirrors (revert a past commit's non-test change at the reference commit) and combined bugs."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweflow.errors import SmithError
from sweflow.sample import materialize_repo
from sweflow.smith.candidates import make_candidate
from sweflow.smith.combine import _draw, combine_candidates
from sweflow.smith.gitrepo import applies, file_patch, git_out, is_test_path, patch_files, run_git
from sweflow.smith.pr_mirror import SKIP_LIMITS, history_commits, lm_file_rewriter, pr_candidates

REPO = "sweflow/calclib"


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return materialize_repo(tmp_path_factory.mktemp("pr") / "calclib")


def _reverse(tree, pr: str, path: str) -> str:
    return git_out(tree, "diff", "--src-prefix=a/", "--dst-prefix=b/", pr, f"{pr}^", "--", path)


class _Recorder:
    """A fake LM: records its calls; by default appends a marker line (a changed file)."""

    def __init__(self, result=lambda path, text: text + "# reverted by the fake LM\n"):
        self.calls: list[tuple[str, str, str]] = []
        self.result = result

    def __call__(self, path, text, diff):
        self.calls.append((path, text, diff))
        return self.result(path, text)


def _by_pr(cands):
    return {c.meta["pr"]: c for c in cands}


# ---- the sample repository ------------------------------------------------------------------------------


def test_history_is_first_parent_non_root_newest_first(sample):
    c = sample.commits
    assert history_commits(sample.path, sample.head) == [c["docs"], c["units_stats"], c["evaluator"]]
    assert history_commits(sample.path, sample.head, limit=2) == [c["docs"], c["units_stats"]]
    assert history_commits(sample.path, c["evaluator"]) == [c["evaluator"]]


def test_sample_without_rewriter_only_the_docs_commit_reverts_cleanly(sample):
    """Later commits touched calclib/__init__.py (units_stats adds imports, docs bumps the version in the
    context of units_stats' hunk), so the reverse of evaluator and units_stats does not apply at head."""
    c = sample.commits
    cands, skipped = pr_candidates(sample.path, sample.head, repo=REPO)
    assert [x.meta["pr"] for x in cands] == [c["docs"]]
    assert skipped == [
        {"commit": c["units_stats"], "reason": "rewrite_failed", "file": "calclib/__init__.py"},
        {"commit": c["evaluator"], "reason": "rewrite_failed", "file": "calclib/__init__.py"},
    ]
    docs = cands[0]
    # The docs commit touches a .py file (the version in calclib/__init__.py), so the rules make it a
    # candidate: README, version and pyproject go back to 0.1.0 (validation will find no failing test).
    assert docs.files == ("README.md", "calclib/__init__.py", "pyproject.toml")
    assert '-__version__ = "0.1.1"\n+__version__ = "0.1.0"' in docs.patch
    assert docs.meta["subject"] == "Document usage in the README; release 0.1.1"
    assert docs.instance_id.startswith(f"sweflow__calclib.{sample.head[:8]}.pr_mirror__")
    assert applies(sample.path, docs.patch)


def test_sample_with_rewriter_mirrors_evaluator_and_units_stats(sample):
    c = sample.commits
    fake = _Recorder()
    cands, skipped = pr_candidates(sample.path, sample.head, repo=REPO, rewrite=fake)
    assert skipped == []
    by_pr = _by_pr(cands)
    assert [x.meta["pr"] for x in cands] == [c["docs"], c["units_stats"], c["evaluator"]]
    assert c["initial"] not in by_pr

    units = by_pr[c["units_stats"]]
    assert units.files == ("calclib/__init__.py", "calclib/errors.py", "calclib/stats.py", "calclib/units.py")
    assert "deleted file mode 100644" in units.patch
    assert "diff --git a/calclib/units.py b/calclib/units.py\ndeleted file mode" in units.patch
    assert "diff --git a/calclib/stats.py b/calclib/stats.py\ndeleted file mode" in units.patch
    # errors.py reverts cleanly (nothing changed it later); __init__.py needed the rewriter.
    assert "-class UnitError(CalcError):" in units.patch
    assert units.meta["rewritten"] == ["calclib/__init__.py"]
    assert units.meta["entity"] == f"commit {c['units_stats'][:12]}"
    assert units.meta["explanation"] == f"reverts the non-test changes of {c['units_stats'][:12]}"
    assert units.meta["subject"] == "Add unit conversion and statistics helpers"

    ev = by_pr[c["evaluator"]]
    assert "diff --git a/calclib/evaluator.py b/calclib/evaluator.py\ndeleted file mode" in ev.patch
    assert ev.meta["rewritten"] == ["calclib/__init__.py", "calclib/errors.py"]

    for cand in cands:
        assert not any(is_test_path(f) for f in cand.files)
        assert not any(is_test_path(f) for f in patch_files(cand.patch))
        assert applies(sample.path, cand.patch), cand.meta["pr"]

    # The rewriter saw the file at head and exactly `git diff C C^ -- path`.
    head_init = git_out(sample.path, "show", f"{sample.head}:calclib/__init__.py")
    first = fake.calls[0]
    assert first == (
        "calclib/__init__.py",
        head_init,
        _reverse(sample.path, c["units_stats"], "calclib/__init__.py"),
    )
    assert [p for p, _, _ in fake.calls] == [
        "calclib/__init__.py",
        "calclib/__init__.py",
        "calclib/errors.py",
    ]


def test_sample_is_deterministic_and_shards_partition(sample):
    fake = _Recorder()
    one = pr_candidates(sample.path, sample.head, repo=REPO, rewrite=fake)
    two = pr_candidates(sample.path, sample.head, repo=REPO, rewrite=fake)
    assert [x.to_dict() for x in one[0]] == [x.to_dict() for x in two[0]] and one[1] == two[1]
    ids, skipped = [], []
    for shard in range(3):
        part = pr_candidates(sample.path, sample.head, repo=REPO, rewrite=fake, shard=shard, shards=3)
        ids += [x.instance_id for x in part[0]]
        skipped += part[1]
    assert sorted(ids) == sorted(x.instance_id for x in one[0]) and len(ids) == len(set(ids))
    assert skipped == []


def test_sample_size_limits(sample):
    c = sample.commits
    fake = _Recorder()

    def reasons(**lim):
        _, skipped = pr_candidates(sample.path, sample.head, repo=REPO, rewrite=fake, limits=lim)
        return {s["commit"]: s["reason"] for s in skipped}

    assert reasons(max_files=3) == {c["units_stats"]: "too_many_files", c["evaluator"]: "too_many_files"}
    # units_stats changes 245 lines, evaluator 144, docs 31.
    assert reasons(max_lines=200) == {c["units_stats"]: "too_many_lines"}
    assert reasons(max_lines=31) == {c["units_stats"]: "too_many_lines", c["evaluator"]: "too_many_lines"}
    # The longest file a history commit touches is calclib/units.py (73 lines at head).
    assert reasons(max_file_lines=72) == {c["units_stats"]: "file_too_long"}
    assert SKIP_LIMITS == {"max_files": 8, "max_lines": 500, "max_file_lines": 10000}


# ---- a hand-made repository -----------------------------------------------------------------------------

_F_V1 = "def f(x):\n    return x\n\n\ndef g(x):\n    return 2 * x\n"
_F_V2 = "def f(x):\n    return x + 1\n\n\ndef g(x):\n    return 2 * x\n"
_F_V3 = "def f(x):\n    # increment\n    return x + 1\n\n\ndef g(x):\n    return 2 * x\n"
_F_V4 = _F_V3.replace("2 * x", "3 * x")


class _Repo:
    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True)
        run_git(path, "init", "-q")
        self.n = 0
        self.shas: dict[str, str] = {}

    def commit(self, name: str, files: dict[str, str | bytes | None]) -> str:
        for rel, content in files.items():
            target = self.path / rel
            if content is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content, encoding="utf-8")
        self.n += 1
        date = f"2024-01-{self.n:02d}T10:00:00+00:00"
        run_git(self.path, "add", "-A")
        run_git(self.path, "commit", "-q", "-m", f"{name} change", date=date)
        self.shas[name] = git_out(self.path, "rev-parse", "HEAD").strip()
        return self.shas[name]


@pytest.fixture(scope="module")
def handmade(tmp_path_factory):
    r = _Repo(tmp_path_factory.mktemp("hand") / "r")
    r.commit(
        "root", {"pkg/__init__.py": "", "pkg/f.py": _F_V1, "tests/test_f.py": "def test_f():\n    pass\n"}
    )
    r.commit("binary", {"pkg/blob.py": "X = 1\n", "pkg/data.bin": bytes(range(256)) * 4})
    r.commit("readme", {"README.md": "# hand\n"})
    r.commit("feature", {"pkg/f.py": _F_V2, "tests/test_f.py": "def test_f():\n    assert True\n"})
    r.commit("touch_f", {"pkg/f.py": _F_V3})  # later change next to feature's line: feature's reverse fails
    r.commit(
        "g", {"pkg/f.py": _F_V4, "pkg/new.py": "Y = 2\n", "tests/test_g.py": "def test_g():\n    pass\n"}
    )
    r.commit("tests_only", {"tests/test_more.py": "def test_more():\n    pass\n"})
    return r


def test_binary_readme_and_tests_only_commits_are_skipped(handmade):
    s = handmade.shas
    cands, skipped = pr_candidates(handmade.path, "HEAD", repo="o/hand", rewrite=_Recorder())
    reasons = {x["commit"]: x["reason"] for x in skipped}
    assert reasons == {s["binary"]: "binary", s["readme"]: "no_python", s["tests_only"]: "no_change"}
    assert {x.meta["pr"] for x in cands} == {s["feature"], s["touch_f"], s["g"]}
    assert s["root"] not in reasons


def test_an_added_file_is_deleted_and_clean_reverse_needs_no_rewriter(handmade):
    s = handmade.shas
    fake = _Recorder()
    cands, _ = pr_candidates(handmade.path, "HEAD", repo="o/hand", rewrite=fake)
    g = _by_pr(cands)[s["g"]]
    assert g.files == ("pkg/f.py", "pkg/new.py")
    assert "+    return 2 * x" in g.patch and "deleted file mode" in g.patch
    assert g.meta["rewritten"] == []
    assert "tests/test_g.py" not in g.patch
    assert all(applies(handmade.path, c.patch) for c in cands)


def test_rewriter_gets_path_current_text_and_reverse_diff_and_its_text_is_used(handmade):
    s = handmade.shas
    reverted = _F_V4.replace("    # increment\n    return x + 1\n", "    return x\n")
    fake = _Recorder(lambda path, text: reverted)
    cands, skipped = pr_candidates(handmade.path, "HEAD", repo="o/hand", rewrite=fake)
    assert fake.calls == [("pkg/f.py", _F_V4, _reverse(handmade.path, s["feature"], "pkg/f.py"))]
    feature = _by_pr(cands)[s["feature"]]
    assert feature.meta["rewritten"] == ["pkg/f.py"]
    assert "-    # increment\n-    return x + 1\n+    return x\n" in feature.patch
    assert "tests/test_f.py" not in feature.patch
    assert applies(handmade.path, feature.patch)


def _lm_down(path, text):
    raise SmithError("LM request failed")


@pytest.mark.parametrize(
    "result",
    [lambda path, text: None, lambda path, text: text, lambda path, text: "def broken(:\n", _lm_down],
    ids=["none", "unchanged", "syntax_error", "request_failed"],
)
def test_rewriter_none_or_unchanged_skips_the_commit(handmade, result):
    s = handmade.shas
    cands, skipped = pr_candidates(handmade.path, "HEAD", repo="o/hand", rewrite=_Recorder(result))
    assert {"commit": s["feature"], "reason": "rewrite_failed", "file": "pkg/f.py"} in skipped
    assert s["feature"] not in _by_pr(cands)


def test_small_limits_on_the_handmade_repo(handmade):
    s = handmade.shas
    cands, skipped = pr_candidates(
        handmade.path, "HEAD", repo="o/hand", rewrite=_Recorder(), limits={"max_files": 1}
    )
    reasons = {x["commit"]: x["reason"] for x in skipped}
    assert reasons[s["feature"]] == "too_many_files" and reasons[s["g"]] == "too_many_files"
    assert [c.meta["pr"] for c in cands] == [s["touch_f"]]  # the one single-file commit
    _, skipped = pr_candidates(
        handmade.path, "HEAD", repo="o/hand", rewrite=_Recorder(), limits={"max_lines": 1}
    )
    assert {x["commit"]: x["reason"] for x in skipped}[s["feature"]] == "too_many_lines"
    _, skipped = pr_candidates(
        handmade.path, "HEAD", repo="o/hand", rewrite=_Recorder(), limits={"max_file_lines": 6}
    )
    assert {x["commit"]: x["reason"] for x in skipped}[s["touch_f"]] == "file_too_long"


def test_limit_is_applied_before_sharding(handmade):
    s = handmade.shas
    cands, skipped = pr_candidates(handmade.path, "HEAD", repo="o/hand", rewrite=_Recorder(), limit=2)
    assert {x.meta["pr"] for x in cands} | {x["commit"] for x in skipped} == {s["tests_only"], s["g"]}


# ---- combine ---------------------------------------------------------------------------------------------


def _edit(tree, path: str, old: str, new: str, name: str, commit: str) -> dict:
    text = git_out(tree, "show", f"{commit}:{path}")
    assert old in text
    patch = file_patch(path, text, text.replace(old, new, 1))
    return make_candidate(
        REPO, commit, "procedural", patch, [path], entity=name, explanation=f"breaks {name}"
    ).to_dict()


@pytest.fixture(scope="module")
def bugs(sample):
    ev, un = "calclib/evaluator.py", "calclib/units.py"
    h = sample.head
    return {
        "sub": _edit(sample.path, ev, '"-": operator.sub', '"-": operator.add', "sub", h),
        "calc": _edit(sample.path, ev, "Evaluator(variables).evaluate", "Evaluator().evaluate", "calc", h),
        "sub2": _edit(sample.path, ev, '"-": operator.sub', '"-": operator.mul', "sub2", h),
        "km": _edit(sample.path, un, '"km": 1000.0', '"km": 100.0', "km", h),
    }


def _combine(sample, validated, **kw):
    kw.setdefault("seed", 7)
    kw.setdefault("max_combos", 10)
    return combine_candidates(validated, repo=REPO, commit=sample.head, tree=sample.path, **kw)


def test_two_bugs_in_one_file_combine(sample, bugs):
    cands, failed = _combine(sample, [bugs["sub"], bugs["calc"], bugs["km"]])
    assert failed == []
    assert len(cands) == 1
    (cand,) = cands
    assert cand.strategy == "combine" and cand.files == ("calclib/evaluator.py",)
    assert cand.meta["members"] == sorted([bugs["sub"]["instance_id"], bugs["calc"]["instance_id"]])
    assert cand.meta["entity"] == "calclib/evaluator.py"
    assert cand.meta["explanation"].startswith("combines ")
    assert "breaks sub" in cand.meta["explanation"] and "breaks calc" in cand.meta["explanation"]
    assert '+    "-": operator.add,' in cand.patch and "+    return Evaluator().evaluate" in cand.patch
    assert cand.instance_id.startswith(f"sweflow__calclib.{sample.head[:8]}.combine__")
    assert applies(sample.path, cand.patch)


def test_overlapping_edits_conflict(sample, bugs):
    cands, failed = _combine(sample, [bugs["sub"], bugs["sub2"]])
    assert cands == []
    assert failed == [
        {"members": sorted([bugs["sub"]["instance_id"], bugs["sub2"]["instance_id"]]), "reason": "conflict"}
    ]
    # With a third member the non-conflicting pairs still combine.
    cands, failed = _combine(sample, [bugs["sub"], bugs["sub2"], bugs["calc"]])
    assert len(cands) == 2 and len(failed) == 2  # {sub,calc}, {sub2,calc} ok; {sub,sub2}, all three conflict
    assert all(applies(sample.path, c.patch) for c in cands)


def test_by_module_groups_across_files_of_a_folder(sample, bugs):
    cands, failed = _combine(sample, [bugs["sub"], bugs["km"]], by="module")
    assert failed == [] and len(cands) == 1
    assert cands[0].files == ("calclib/evaluator.py", "calclib/units.py")
    assert cands[0].meta["entity"] == "calclib" and cands[0].meta["by"] == "module"
    assert _combine(sample, [bugs["sub"], bugs["km"]], by="file") == ([], [])


def test_multi_file_and_combine_inputs_are_ignored(sample, bugs):
    combined, _ = _combine(sample, [bugs["sub"], bugs["calc"]])
    two_files = dict(bugs["km"], files=["calclib/evaluator.py", "calclib/units.py"])
    cands, failed = _combine(sample, [bugs["sub"], combined[0].to_dict(), two_files])
    assert cands == [] and failed == []


def test_max_combos_and_determinism(sample, bugs):
    tree, h = sample.path, sample.head
    extra = [
        _edit(tree, "calclib/evaluator.py", f'"{name}": math.{name}', f'"{name}": math.floor', name, h)
        for name in ("sqrt", "exp", "log", "sin", "cos")
    ]
    pool = [bugs["calc"], *extra]  # 6 members: C(6,2)+C(6,3) = 35 possible combinations
    cands, failed = _combine(sample, pool, max_combos=4, seed=1)
    assert len(cands) + len(failed) == 4
    combos = [tuple(c.meta["members"]) for c in cands] + [tuple(f["members"]) for f in failed]
    assert len(set(combos)) == 4 and all(list(m) == sorted(m) and 2 <= len(m) <= 3 for m in combos)
    again = _combine(sample, list(reversed(pool)), max_combos=4, seed=1)
    assert [c.to_dict() for c in again[0]] == [c.to_dict() for c in cands] and again[1] == failed
    other = _combine(sample, pool, max_combos=4, seed=2)
    assert [tuple(c.meta["members"]) for c in other[0]] + [tuple(f["members"]) for f in other[1]] != combos
    # All 15 pairs: the five (calc, math edit) pairs and sqrt+cos (lines 13 and 17, outside each other's
    # 3 lines of context) combine; the other math edits are too close, each changes the other's context.
    everything, conflicts = _combine(sample, pool, max_combos=100, max_bugs=2)
    ids = {b["meta"]["entity"]: b["instance_id"] for b in pool}
    expected = {tuple(sorted([ids["calc"], ids[n]])) for n in ("sqrt", "exp", "log", "sin", "cos")}
    expected.add(tuple(sorted([ids["sqrt"], ids["cos"]])))
    assert {tuple(c.meta["members"]) for c in everything} == expected and len(everything) == 6
    assert len(conflicts) == 9 and all(f["reason"] == "conflict" for f in conflicts)


def test_large_groups_draw_distinct_combinations_one_by_one():
    import random

    ids = [f"b{i:02d}" for i in range(40)]  # 10,660 possible combinations: drawn, repeats rejected
    drawn = _draw(random.Random("1:g"), ids, 2, 3, 50)
    assert len(drawn) == len(set(drawn)) == 50
    assert all(list(c) == sorted(c) and 2 <= len(c) <= 3 for c in drawn)
    assert drawn == _draw(random.Random("1:g"), ids, 2, 3, 50)
    assert _draw(random.Random("1:g"), ids[:1], 2, 3, 50) == []


def test_combine_rejects_bad_arguments(sample, bugs):
    with pytest.raises(SmithError):
        _combine(sample, [bugs["sub"]], by="package")
    with pytest.raises(SmithError):
        _combine(sample, [bugs["sub"]], min_bugs=1)


# ---- the LM rewriter -------------------------------------------------------------------------------------


def test_lm_file_rewriter_fills_the_prompt_and_its_reply_is_used(handmade):
    from sweflow.offline.scripted_lm import ScriptedLM, offline_responder
    from sweflow.smith.lm import LMSettings, fence_block

    s = handmade.shas
    reverted = _F_V4.replace("    # increment\n    return x + 1\n", "    return x\n")
    with ScriptedLM([fence_block(reverted.rstrip("\n"))]) as server:
        rewrite = lm_file_rewriter(LMSettings(server.url))
        cands, _ = pr_candidates(handmade.path, "HEAD", repo="o/hand", rewrite=rewrite)
    (request,) = server.requests
    assert "Task: pr_rewrite" in request["user"] and "`pkg/f.py`" in request["user"]
    assert _F_V4.rstrip("\n") in request["user"]
    assert _reverse(handmade.path, s["feature"], "pkg/f.py").rstrip("\n") in request["user"]
    feature = _by_pr(cands)[s["feature"]]
    assert "-    # increment\n-    return x + 1\n+    return x\n" in feature.patch
    assert applies(handmade.path, feature.patch)
    # The offline stand-in applies the reverse diff by line content: the same reversal.
    with ScriptedLM(offline_responder) as server:
        offline, skipped = pr_candidates(
            handmade.path, "HEAD", repo="o/hand", rewrite=lm_file_rewriter(LMSettings(server.url))
        )
    assert s["feature"] not in {r["commit"] for r in skipped}
    lenient = _by_pr(offline)[s["feature"]].patch
    assert "-    return x + 1\n" in lenient and "+    return x\n" in lenient
    assert applies(handmade.path, lenient)
    assert lm_file_rewriter(LMSettings("http://127.0.0.1:9/v1"))("README.md", "```\nx\n```\n", "") is None
