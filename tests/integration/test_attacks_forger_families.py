"""The adaptive forger families of issue 44 (tests/fixtures/forgers.py: memory reading, clone clusters with a
guess, position, the project's own twin-aware forger) on every sample task, in real Docker and local
sandboxes, with the tamper scan off so the canaries and the decoy run alone must hold. Each patch only
appends to ``calclib/__init__.py`` and fixes nothing.

Through the rollouts' evaluation (``evaluate_agent_patch``: one decoy run after a resolved run) a family is
never paid on a task whose gold runs carry FAIL_TO_PASS twins; on the one task without (calclib-9: its
parametrized test derives its expected text from its input) it may be, and that is the task validation
lists under ``without_f2p_twins`` and GRPO leaves out (``sweflow.stages.train.guarded_rows``). Through validation, a row
whose "gold" patch is a forger is never valid where the gold runs carry twins (the decoy run included;
validation keeps its tamper scan, which names ``runtest``).
Rates over many evaluations: benchmarks/bench_forge_rate.py.
"""

from __future__ import annotations

import functools

import pytest

from sweflow.grading.agent_eval import evaluate_agent_patch
from sweflow.grading.evaluate import evaluate_patch
from sweflow.grading.task_validation import validate_task
from sweflow.sample import instance_ids, load_task
from tests.fixtures.forgers import FAMILIES

try:
    from tests.integration.conftest_validation import docker_env, local_env
    from tests.integration.test_attacks_reward import NO_TAMPER_SCAN, _init_with
except ModuleNotFoundError:  # pragma: no cover
    from conftest_validation import docker_env, local_env  # type: ignore[no-redef]
    from test_attacks_reward import NO_TAMPER_SCAN, _init_with  # type: ignore[no-redef]

pytestmark = [pytest.mark.integration]

IDS = instance_ids(None)
# the sample task whose FAIL_TO_PASS tests get no twin: no expected literal (``match=text.split("(")[0]``);
# calclib-4's are parametrized with the literal in the body, and get parametrized twins
TWINLESS = {"sweflow__calclib-9"}


@pytest.fixture(scope="module", params=["docker", "local"])
def env(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"forgers-{request.param}")
    return (docker_env if request.param == "docker" else local_env)(tmp, ids=tuple(IDS))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_no_family_is_paid_where_the_gold_runs_carry_twins(env, family):
    paid, twinless = [], []
    for iid in IDS:
        task = load_task(iid)
        res = evaluate_agent_patch(
            env.provider, env.templates[iid], env.meta(task), _init_with(env, task, FAMILIES[family]),
            rules=NO_TAMPER_SCAN, sandbox_timeout=300,
        )  # fmt: skip
        assert res.error is None, (iid, res.error)  # an infrastructure fault is no verdict about the attack
        assert res.canaries, (iid, "every sample task carries canaries")
        if not any(c["of"] == "f2p" for c in res.canaries):
            twinless.append(iid)
        if res.reward == 1.0:
            paid.append(iid)
        else:
            assert res.failure_reason in ("runner_tampered", "fail_to_pass_failure"), (
                iid,
                res.failure_reason,
            )
    assert set(twinless) == TWINLESS
    assert set(paid) <= TWINLESS, f"{family} paid on {sorted(set(paid) - TWINLESS)}"


@pytest.mark.parametrize("scan", [True, False], ids=["scan", "canaries_only"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_forger_as_the_gold_patch_is_never_valid_where_twins_are_planted(env, family, scan, monkeypatch):
    """Validation's tamper scan names ``runtest``; with it off, the canaries and the decoy run must hold
    (a clone-cluster guess that is right resolves the gold run, and the decoy run catches it)."""
    iid = "sweflow__calclib-1"
    task = load_task(iid)
    evaluate = evaluate_patch
    if not scan:  # validation's own pre-check of the gold patch and each run's
        from sweflow.grading import task_validation
        from sweflow.grading.patch import check_patch

        monkeypatch.setattr(
            task_validation, "check_patch", functools.partial(check_patch, rules=NO_TAMPER_SCAN)
        )
        evaluate = functools.partial(evaluate_patch, rules=NO_TAMPER_SCAN)
    patch = _init_with(env, task, FAMILIES[family])
    rec = validate_task(env.provider, env.meta(task), patch, repeats=1, evaluate=evaluate)
    assert rec["verdict"] == "gold_fails", (rec["verdict"], rec["reason"])
    tags = ("suspicious_test_tampering",) if scan else ("runner_tampered", "fail_to_pass_failure")
    assert any(tag in rec["reason"] for tag in tags), rec["reason"]


def test_the_gold_patch_stays_valid_with_its_decoy_run(env):
    task = load_task("sweflow__calclib-1")
    rec = validate_task(env.provider, env.meta(task), task["patch"], repeats=1)
    assert (rec["verdict"], rec["decoys"]) == ("valid", 1), rec
    [decoy] = [r for r in rec["runs"] if r["patch"] == "decoy"]
    assert decoy["failure_reason"] != "runner_tampered" and decoy["f2p_twins"] >= 2, decoy


def test_the_decoy_run_names_a_gold_patch_whose_guess_was_right(env):
    """What the decoy run is for, made certain: the gold runs get the real fix (as if the clone-cluster
    forger's one-in-three guesses had all hit) and the decoy run the forger, whose stand-in and twins are all
    must-fail, so the one it no-ops passes; the trusted gold patch is named there (gold_fails)."""
    task = load_task("sweflow__calclib-1")
    forger = _init_with(env, task, FAMILIES["clone_cluster"])

    def evaluate(provider, template, metadata, patch, **kw):
        chosen = forger if kw.get("decoy") else patch
        return evaluate_patch(provider, template, metadata, chosen, rules=NO_TAMPER_SCAN, **kw)

    rec = validate_task(env.provider, env.meta(task), task["patch"], repeats=1, evaluate=evaluate)
    assert rec["verdict"] == "gold_fails" and "decoy run" in rec["reason"], (rec["verdict"], rec["reason"])
    [decoy] = [r for r in rec["runs"] if r["patch"] == "decoy"]
    assert decoy["failure_reason"] == "runner_tampered", decoy
