"""SWE-smith validation and gather with real (bubblewrap) sandboxes on the sample repository: kept bugs get
the right FAIL_TO_PASS / PASS_TO_PASS, harmless, hanging, flaky and broken candidates are each reported for
what they are, and the gathered rows are SWE-bench tasks the data stage accepts and validate_task confirms."""

from __future__ import annotations

import pytest

from sweflow.smith.bug_validation import reference_run, reference_verdict, validate_candidate
from sweflow.smith.candidates import make_candidate
from sweflow.smith.env import build_environment, materialize_source
from sweflow.smith.gitrepo import checkout, file_patch, run_git
from sweflow.smith.profile import load_profile

try:
    from tests.integration.conftest_validation import bwrap_available, metadata_for, sample_harness
except ModuleNotFoundError:  # pragma: no cover
    from conftest_validation import bwrap_available, metadata_for, sample_harness  # type: ignore[no-redef]

pytestmark = [pytest.mark.integration]

STATS = "calclib/stats.py"
MEAN_BODY = "    return sum(values) / len(values)\n"
MEDIAN_BODY = "    return values[len(values) // 2]\n"


class Env:
    def __init__(self, tmp):
        why = bwrap_available()
        if why:
            pytest.skip(why)
        from sweflow.sandbox.registry import provider_from_config
        from sweflow.sandbox.settings import SandboxSettings

        self.harness = sample_harness()
        self.parser = self.harness.find_parser("parse_log_pytest")
        # a short per-run timeout so the hanging candidate costs seconds
        self.profile = load_profile({"name": "calclib", "repo": "sweflow/calclib", "source": "sample",
                                     "timeout_sec": 20})  # fmt: skip
        self.bare = tmp / "repo.git"
        src = materialize_source(self.profile, self.bare)
        self.commit, self.date = src["commit"], src["date"]
        cfg = SandboxSettings.from_config({"local": {"templates_root": str(tmp / "templates")}})
        self.provider = provider_from_config("local", cfg, purpose="eval")
        build = provider_from_config("local", cfg, purpose="build")
        self.template = build_environment(build, "local", self.profile, self.bare, self.commit, settings=cfg)[
            "template"
        ]
        res = reference_run(
            self.provider, self.template, self.profile, self.commit, parser=self.parser, runs=2
        )
        self.reference = reference_verdict(res, self.profile)
        self.tree = checkout(self.bare, self.commit, tmp / "tree")
        self.stats = (self.tree / STATS).read_text()

    def cand(self, new_stats: str, name: str):
        patch = file_patch(STATS, self.stats, new_stats)
        return make_candidate("sweflow/calclib", self.commit, "procedural", patch, [STATS], entity=name)

    def validate(self, cand, runs=2):
        return validate_candidate(self.provider, self.template, self.profile, self.commit, cand, self.reference,
                                  parser=self.parser, runs=runs)  # fmt: skip


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return Env(tmp_path_factory.mktemp("smith"))


def test_reference_run_passes_the_whole_suite(env):
    ref = env.reference
    assert ref["ok"] and ref["tests"] == 55 and len(ref["passed"]) == 55 and ref["flaky"] == []


def test_bug_that_breaks_tests_is_kept_with_its_f2p_and_p2p(env):
    cand = env.cand(env.stats.replace(MEAN_BODY, "    return sum(values) / (len(values) + 1)\n"), "mean")
    rep = env.validate(cand)
    assert rep["status"] == "kept"
    # mean() is used by test_mean, variance and summary
    assert rep["FAIL_TO_PASS"] == [
        "tests/test_stats.py::test_mean",
        "tests/test_stats.py::test_summary",
        "tests/test_stats.py::test_variance_of_constant_data_is_zero",
    ]
    assert len(rep["PASS_TO_PASS"]) == 52 and not set(rep["PASS_TO_PASS"]) & set(rep["FAIL_TO_PASS"])
    assert [r["exit_code"] for r in rep["runs"]] == [1, 1]
    assert "test_mean" in rep["failing_output"]
    # the host's canaries ran in every run, and left no trace in what the task keeps
    assert [r["canaries"] for r in rep["runs"]] == [2, 2]
    names = {t.split("::")[1] for t in rep["FAIL_TO_PASS"] + rep["PASS_TO_PASS"]}
    assert names <= {t.split("::")[1] for t in env.reference["passed"]}
    failed = [ln.split()[1] for ln in rep["failing_output"].splitlines() if ln.startswith("FAILED ")]
    assert failed and set(failed) <= set(rep["FAIL_TO_PASS"]), rep["failing_output"][-800:]


def test_the_failing_output_comes_from_a_canary_free_run_and_is_the_same_every_time(env):
    # the canaries are drawn anew per run and change what a log shows (its summary's counts, the first
    # import a collection error names): the output problem statements are written from is a third run's,
    # without canaries, so the same bug gives the same text on every validation
    cand = env.cand(env.stats.replace(MEAN_BODY, "    return sum(values) / (len(values) + 1)\n"), "mean")
    reps = [env.validate(cand) for _ in range(3)]
    assert {r["status"] for r in reps} == {"kept"}
    assert [r["canaries"] for r in reps[0]["runs"]] == [2, 2]
    outs = {r["failing_output"] for r in reps}
    assert len(outs) == 1, "the failing output differs between validations of one candidate"
    summary = [ln for ln in outs.pop().splitlines() if ln.startswith("=") and " in <duration>" in ln]
    assert summary and " 3 failed, 52 passed in <duration> " in summary[-1], summary


# The candidate's code owns the runner too: it no-ops every test but one it makes fail, so the "bug" is the
# tampering itself. Only the canaries (must fail, now "passing") tell.
TAMPER = """
import pytest as _p
def _runtest(self):
    if self.name == "test_mean":
        raise AssertionError("mean is off")
_p.Function.runtest = _runtest
"""


def test_a_candidate_that_owns_the_runner_is_runner_tampered(env):
    init = (env.tree / "calclib/__init__.py").read_text()
    patch = file_patch("calclib/__init__.py", init, init + TAMPER)
    cand = make_candidate(
        "sweflow/calclib", env.commit, "lm_rewrite", patch, ["calclib/__init__.py"], entity="x"
    )
    rep = env.validate(cand)
    assert rep["status"] == "runner_tampered" and "canary" in rep["error"], rep
    off = validate_candidate(env.provider, env.template, env.profile, env.commit, cand, env.reference,
                             parser=env.parser, runs=2, canaries=False)  # fmt: skip
    assert off["status"] == "kept" and off["FAIL_TO_PASS"] == ["tests/test_stats.py::test_mean"], off


def test_bug_that_breaks_nothing_is_dropped(env):
    cand = env.cand(
        env.stats.replace(MEAN_BODY, "    total = sum(values)\n    return total / len(values)\n"), "m"
    )
    rep = env.validate(cand)
    assert rep["status"] == "no_fail_to_pass" and rep["FAIL_TO_PASS"] == [] and len(rep["PASS_TO_PASS"]) == 55


def test_bug_that_hangs_the_suite_is_a_timeout(env):
    cand = env.cand(env.stats.replace(MEAN_BODY, "    while True:\n        pass\n"), "mean")
    rep = env.validate(cand)
    assert rep["status"] == "timeout" and "FAIL_TO_PASS" not in rep
    assert rep["runs"][0]["timed_out"] and len(rep["runs"]) == 1  # the second run is not attempted
    assert 20 <= rep["seconds"] < 90


def test_flaky_test_never_becomes_f2p(env):
    # median() is always wrong; mean() is wrong only on a sandbox's first run (a marker in /tmp, which
    # survives between runs): k = 2 runs see test_mean fail then pass.
    flaky_mean = (
        "    import os\n    if not os.path.exists('/tmp/.calclib-ran'):\n"
        "        open('/tmp/.calclib-ran', 'w').close()\n        return 0\n" + MEAN_BODY
    )
    new = env.stats.replace(MEAN_BODY, flaky_mean).replace(MEDIAN_BODY, "    return values[0]\n")
    rep = env.validate(env.cand(new, "mean+median"))
    assert rep["status"] == "kept"
    assert "tests/test_stats.py::test_median_odd_length" in rep["FAIL_TO_PASS"]
    assert "tests/test_stats.py::test_mean" in rep["flaky"]
    assert "tests/test_stats.py::test_mean" not in rep["FAIL_TO_PASS"] + rep["PASS_TO_PASS"]
    # with k = 1 (upstream) the same candidate turns the flaky test into a FAIL_TO_PASS test
    one = env.validate(env.cand(new, "mean+median"), runs=1)
    assert "tests/test_stats.py::test_mean" in one["FAIL_TO_PASS"]


def test_collection_errors_make_absent_tests_f2p_and_a_suite_without_tests_is_dropped(env):
    # a syntax error in stats.py: only tests/test_stats.py fails to collect (the default test command goes
    # on past collection errors), so its tests are FAIL_TO_PASS and the other modules' PASS_TO_PASS
    rep = env.validate(env.cand(env.stats.replace("def mean(data):", "def mean(data)::"), "mean"))
    assert rep["status"] == "kept"
    assert {t.split("::")[0] for t in rep["FAIL_TO_PASS"]} == {"tests/test_stats.py"}
    assert rep["PASS_TO_PASS"] and not any(t.startswith("tests/test_stats.py") for t in rep["PASS_TO_PASS"])
    # a syntax error in errors.py, which every module imports: no test of the reference is in the log;
    # counting them all as failing would make a task of the whole suite with every test file hidden
    old = (env.tree / "calclib/errors.py").read_text()
    patch = file_patch("calclib/errors.py", old, old.replace("class ", "class :", 1))
    cand = make_candidate(
        "sweflow/calclib", env.commit, "procedural", patch, ["calclib/errors.py"], entity="e"
    )
    rep = env.validate(cand)
    assert rep["status"] == "no_tests_in_log" and "FAIL_TO_PASS" not in rep


def test_candidate_that_does_not_apply_is_reported(env):
    patch = file_patch(STATS, "def nothing():\n    pass\n", "def nothing():\n    return 1\n")
    cand = make_candidate("sweflow/calclib", env.commit, "procedural", patch, [STATS], entity="nothing")
    rep = env.validate(cand)
    assert rep["status"] == "apply_failed" and "git apply failed" in rep["error"]


def test_infrastructure_failure_is_an_error_not_a_verdict(env):
    cand = env.cand(env.stats.replace(MEDIAN_BODY, "    return values[0]\n"), "median")
    rep = validate_candidate(env.provider, "no-such-template", env.profile, env.commit, cand, env.reference,
                             parser=env.parser, runs=2, attempts=2)  # fmt: skip
    assert rep["status"] == "error" and "FAIL_TO_PASS" not in rep and rep["error"]


def test_gathered_tasks_are_valid_swebench_rows(env, tmp_path):
    """Gather two kept bugs; the rows pass the data stage's split validation; in fresh sandboxes of each
    task's own commit the fix resolves and the empty patch does not; no task repository holds the fix."""
    from sweflow.grading.task_validation import validate_task
    from sweflow.sample import write_parquet
    from sweflow.sandbox.spec import TemplateSpec
    from sweflow.smith.gather import ROW_COLUMNS, gather, task_repository
    from sweflow.stages.data import validate_split

    cands = [
        env.cand(env.stats.replace(MEAN_BODY, "    return sum(values) / (len(values) + 1)\n"), "mean"),
        env.cand(env.stats.replace(MEDIAN_BODY, "    return values[0]\n"), "median"),
    ]
    kept = [(c, env.validate(c)) for c in cands]
    assert [r["status"] for _, r in kept] == ["kept", "kept"]
    rows = gather(env.profile, env.bare, env.commit, env.date, kept, tmp_path / "tasks.git")
    again = gather(env.profile, env.bare, env.commit, env.date, kept, tmp_path / "tasks2.git")
    assert [r["base_commit"] for r in rows] == [r["base_commit"] for r in again]  # pinned: same shas
    parquet = tmp_path / "train.parquet"
    write_parquet([{c: r[c] or ("statement" if c == "problem_statement" else r[c]) for c in ROW_COLUMNS}
                   for r in rows], parquet)  # fmt: skip
    report = validate_split(parquet, tmp_path / "report.json", split="train", expected_rows=2, shape="raw")
    assert report["rows"] == 2
    build = env.provider  # the local provider builds templates too
    for row in rows:
        assert row["base_commit"] != env.commit and row["environment_setup_commit"] == env.commit
        assert "tests/test_stats.py" in row["test_patch"] and "new file mode" in row["test_patch"]
        assert row["patch"].startswith(f"diff --git a/{STATS} b/{STATS}")
        repo, sha = task_repository(tmp_path / "tasks.git", row["instance_id"], tmp_path / row["instance_id"])
        assert sha == row["base_commit"]
        # one parentless commit, the F2P test file hidden, and no other task's objects
        assert run_git(repo, "rev-list", "--all").stdout.split() == [sha]
        files = run_git(repo, "ls-tree", "-r", "--name-only", sha).stdout.split()
        assert "tests/test_stats.py" not in files and "tests/test_units.py" in files
        image = f"sweflow-smith/{row['instance_id']}:latest"
        tpl = build.build(
            TemplateSpec(image=image), row["instance_id"].replace(".", "-"), repo=repo, commit=sha
        )
        meta = metadata_for(env.harness, row, tpl.template, "local")
        rec = validate_task(env.provider, meta, row["patch"], repeats=1)
        assert rec["verdict"] == "valid", [
            (r["patch"], r["failure_reason"], r.get("output_tail", "")[-1500:]) for r in rec["runs"]
        ]
        assert rec["gold"] == {"resolved": 1, "runs": 1} and rec["empty"] == {"resolved": 0, "runs": 1}


def test_repository_whose_reference_fails_is_reported_and_skipped(tmp_path):
    """A reference run whose parser finds no tests (the upstream defect that silently lost half the
    repositories) makes the repository `ok: false` with the reason; its strategies and gather run and
    report it, producing nothing, and nothing raises."""
    from sweflow.stages.smith import bug_candidates_step, gather_step, repo_env_step
    from sweflow.util import read_json

    why = bwrap_available()
    if why:
        pytest.skip(why)
    sample_harness()
    prof = load_profile({"name": "calclib", "repo": "sweflow/calclib", "source": "sample",
                         "test_cmd": "pytest -rA -k no_such_test"})  # fmt: skip
    cfg = {"local": {"templates_root": str(tmp_path / "templates")}}
    env = repo_env_step(prof, tmp_path / "repo.git", tmp_path / "env.json", provider="local", sandbox_cfg=cfg,
                        runs=2, harness_package="swebench")  # fmt: skip
    assert env["ok"] is False and "found no tests" in env["reference"]["reason"]
    smith = {"seed": 0, "strategies": {"procedural": {"shards": 1, "per_entity": 1, "min_complexity": 3}}}
    rep = bug_candidates_step("procedural", 0, tmp_path / "env.json", tmp_path / "repo.git",
                              tmp_path / "c.jsonl", tmp_path / "c.report.json", smith=smith)  # fmt: skip
    assert rep["candidates"] == 0 and rep["repository_ok"] is False
    summary = gather_step(tmp_path / "env.json", tmp_path / "repo.git", [], [str(tmp_path / "c.jsonl")],
                          tmp_path / "tasks.jsonl", tmp_path / "tasks.git", tmp_path / "summary.json")  # fmt: skip
    assert summary["repository_ok"] is False and summary["tasks"] == 0
    assert read_json(tmp_path / "summary.json")["reference"]["reason"] == env["reference"]["reason"]


@pytest.mark.docker
def test_docker_environment_and_validation(tmp_path):
    """The same branch with the Docker provider: the environment image is built from the bare repository on
    the locally built Debian base, the reference passes, and a bug is kept with its F2P."""
    from sweflow.sandbox.registry import provider_from_config
    from sweflow.sandbox.settings import SandboxSettings
    from sweflow.stages.smith import repo_env_step
    from tests.integration.conftest_validation import docker_available

    why = docker_available()
    if why:
        pytest.skip(why)
    harness = sample_harness()
    prof = load_profile({"name": "calclib", "repo": "sweflow/calclib", "source": "sample", "timeout_sec": 60})
    cfg = {"docker": {"cpus": 1, "mem_mb": 1024}}
    env = repo_env_step(prof, tmp_path / "repo.git", tmp_path / "env.json", provider="docker", sandbox_cfg=cfg,
                        runs=2, harness_package="swebench")  # fmt: skip
    assert env["ok"], env["reference"]
    assert env["template"]["image"] == f"sweflow-smith/sweflow__calclib.{env['commit'][:8]}:latest"
    assert len(env["reference"]["passed"]) == 55
    tree = checkout(tmp_path / "repo.git", env["commit"], tmp_path / "tree")
    stats = (tree / STATS).read_text()
    patch = file_patch(STATS, stats, stats.replace(MEDIAN_BODY, "    return values[0]\n"))
    cand = make_candidate("sweflow/calclib", env["commit"], "procedural", patch, [STATS], entity="median")
    rep = validate_candidate(provider_from_config("docker", SandboxSettings.from_config(cfg), purpose="eval"),
                             env["template"]["template"],
                             prof, env["commit"], cand, env["reference"],
                             parser=harness.find_parser("parse_log_pytest"), runs=2)  # fmt: skip
    assert rep["status"] == "kept", rep
    assert (
        "tests/test_stats.py::test_median_odd_length" in rep["FAIL_TO_PASS"] and len(rep["PASS_TO_PASS"]) > 40
    )
