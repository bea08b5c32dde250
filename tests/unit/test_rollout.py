"""The rollout dispatcher's control flow: happy path, integrity, every abort path, concurrency, group indices.

Real proxy (ScriptedEngine + tiny tokenizer), real blackbox server and HTTP clients; the provider, the agent
binary and the evaluator are in-process fakes (see conftest_rollout.py).
"""

from __future__ import annotations

import shutil
import sys
import threading
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from sweflow.offline.scripted_engine import ScriptedEngine  # noqa: E402
from sweflow.proxy import EngineError, ProxyServer, format_qwen_xml  # noqa: E402
from sweflow.rollout import (  # noqa: E402
    ABORTED,
    COMPLETED,
    SANDBOX_DIED,
    Dispatcher,
    HttpProxyClient,
    RolloutConfig,
    new_session_id,
    patch_stats,
)
from sweflow.rollout.dispatcher import loopback_egress  # noqa: E402
from tests.unit.conftest_proxy import tiny_tokenizer  # noqa: E402
from tests.unit.conftest_rollout import (  # noqa: E402
    FakeEvaluator,
    FakeProvider,
    make_repo,
    training_row,
    write_agent,
)

READ = format_qwen_xml("Read", {"file_path": "calc.py"})
FIX = format_qwen_xml("Edit", {"file_path": "calc.py", "old_string": "a - b", "new_string": "a + b"})
TEST_EDIT = format_qwen_xml(
    "Edit", {"file_path": "tests/test_calc.py", "old_string": "== 3", "new_string": "== -1"}
)
GOOD = ["Let me look.\n" + READ, FIX, "Fixed."]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture()
def env(tmp_path):
    repo = tmp_path / "repo"
    base = make_repo(repo)
    agent = write_agent(tmp_path / "fake-claude")
    provider = FakeProvider(tmp_path, repo, agent)
    return provider, base


def step_policy(turns: list[str], tok, seen: list[str], hook=None):
    """A policy choosing the turn by how many assistant turns the prompt already holds (retry-proof)."""

    def policy(prompt_ids: list[int]) -> str:
        k = tok.decode(prompt_ids).count("<|im_start|>assistant") - 1
        if hook is not None:
            hook(k)
        text = turns[min(k, len(turns) - 1)]
        seen.append(text)
        return text

    return policy


def run_one(provider, tok, turns, row, *, evaluator=None, hook=None, config=None, engine=None):
    seen: list[str] = []
    engine = engine or ScriptedEngine(step_policy(turns, tok, seen, hook), tok)
    with ProxyServer(engine, tok) as proxy:
        client = HttpProxyClient(proxy.url, admin_token=proxy.admin_token)
        d = Dispatcher(provider, client, evaluator=evaluator or FakeEvaluator(), config=config)
        result = d.run_sample(row, 3)
        leftover = proxy._sessions.keys() - set()
        port = proxy.url.rsplit(":", 1)[1]
    if provider.egresses:
        assert provider.egresses[0] == f"127.0.0.1:{port}", "the agent sandbox may reach the proxy only"
    return result, seen, leftover


def assert_all_killed(provider):
    assert provider.created and all(sb.killed for sb in provider.created)
    assert provider.live == 0


def test_good_policy_is_resolved_and_tokens_match_the_engine_output(env, tok):
    provider, base = env
    ev = FakeEvaluator()
    result, seen, leftover = run_one(provider, tok, GOOD, training_row(base), evaluator=ev)
    assert result.status == COMPLETED and result.failure_reason is None, result.error
    assert (result.reward, result.resolved, result.group_index) == (1.0, True, 3)
    assert result.patch["files"] == ["calc.py"] and result.patch["lines_added"] == 1
    assert result.integrity_violations == [] and result.agent["tool_calls"] == 2
    assert len(ev.evaluated) == 1 and len(provider.created) == 2, "one agent sandbox, one fresh sandbox"
    assert provider.egresses[1] is None, "the evaluation sandbox reaches nothing"
    assert_all_killed(provider)
    assert leftover == set(), "the proxy session is deleted once read"
    # One folded sample; its model-output tokens are exactly what the engine produced, turn by turn.
    [sample] = result.samples
    assert sample["num_turns"] == 3 == len(seen)
    ids, mask = sample["token_ids"], sample["loss_mask"]
    assert len(ids) == len(mask) == len(sample["rollout_logprobs"])
    spans, cur = [], []
    for t, m in zip(ids, mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            spans.append(cur)
            cur = []
    spans.append(cur)
    assert [tok.decode(s) for s in spans] == [t + "<|im_end|>" for t in seen]
    assert all(lp == 0.0 for lp, m in zip(sample["rollout_logprobs"], mask, strict=True) if not m)
    [ts] = result.training_samples()
    assert ts["reward"] == 1.0 and ts["group_index"] == 3 and ts["status"] == COMPLETED
    assert ts["token_ids"] == ids


def test_test_file_edit_zeroes_the_reward_with_the_integrity_reason(env, tok):
    provider, base = env
    turns = ["Let me look.\n" + READ, FIX, TEST_EDIT, "Done."]
    result, _, _ = run_one(provider, tok, turns, training_row(base))
    assert result.status == COMPLETED
    assert (result.reward, result.resolved) == (0.0, False)
    assert result.failure_reason == "integrity_violation:test_edit"
    assert result.patch["failure_reason"] == "prohibited_test_modification"
    assert result.patch["test_files"] == ["tests/test_calc.py"]
    assert result.integrity_violations[0]["tool"] == "Edit"
    assert result.evaluation["skipped"] is True
    assert len(result.training_samples()) == 1 and result.training_samples()[0]["reward"] == 0.0
    assert_all_killed(provider)


class RealExtraction(FakeEvaluator):
    """The real patch extraction (sweflow.grading.evaluate.extract_patch) in the fake agent sandbox."""

    def extract_patch(self, sb, base_commit):
        from sweflow.grading.evaluate import extract_patch

        before = set(Path("/tmp").glob(".sweflow-extract-*"))
        try:
            return extract_patch(sb, base_commit, workdir=str(sb.workdir), attempts=1)
        finally:  # the fake sandbox shares the host's /tmp
            for d in set(Path("/tmp").glob(".sweflow-extract-*")) - before:
                shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("command", ["rm -rf .git", "git config core.bare true", "echo garbage > .git/HEAD"])
def test_an_agent_that_breaks_its_own_patch_extraction_gets_0_not_an_abort(env, tok, command):
    """What the agent does to its own repository cannot take its sample out of training."""
    provider, base = env
    bash = format_qwen_xml("Bash", {"command": command})
    result, _, _ = run_one(
        provider, tok, [FIX, bash, "Done."], training_row(base), evaluator=RealExtraction()
    )
    assert (result.status, result.reward, result.failure_reason) == (COMPLETED, 0.0, "patch_unextractable"), (
        result
    )
    assert result.patch["failure_reason"] == "patch_unextractable" and result.evaluation["skipped"] is True
    assert len(result.training_samples()) == 1 and result.training_samples()[0]["reward"] == 0.0
    assert_all_killed(provider)


def test_real_extraction_of_an_honest_fix(env, tok):
    provider, base = env
    result, _, _ = run_one(provider, tok, GOOD, training_row(base), evaluator=RealExtraction())
    assert (result.status, result.reward) == (COMPLETED, 1.0), result


def test_sanitizer_failure_aborts_before_the_agent_runs(env, tok):
    provider, base = env
    row = training_row(base, sanitizer="echo no base commit >&2; exit 3")
    result, seen, _ = run_one(provider, tok, GOOD, row)
    assert result.status == ABORTED and result.failure_reason == "before_agent_failed:git_sanitizer"
    assert "exit 3" in result.error and "no base commit" in result.error
    assert seen == [] and result.training_samples() == []
    assert_all_killed(provider)


def test_an_optional_before_agent_failure_does_not_abort(env, tok):
    provider, base = env
    row = training_row(base, sanitizer="exit 1", required=False)
    result, _, _ = run_one(provider, tok, GOOD, row)
    assert result.status == COMPLETED and result.reward == 1.0


def test_sandbox_dying_mid_turn_aborts_with_sandbox_died(env, tok):
    provider, base = env

    def kill_on_second_turn(k: int) -> None:
        if k == 1:
            provider.created[0].kill()

    result, _, _ = run_one(provider, tok, GOOD, training_row(base), hook=kill_on_second_turn)
    assert result.status == ABORTED and result.failure_reason == SANDBOX_DIED, result
    assert len(provider.created) == 1, "no evaluation sandbox after an abort"
    assert_all_killed(provider)


def test_engine_error_behind_the_proxy_aborts_with_proxy_error(env, tok):
    provider, base = env
    engine = ScriptedEngine(GOOD, tok, fail_with=EngineError("GPU fell off"))
    result, _, _ = run_one(provider, tok, GOOD, training_row(base), engine=engine)
    assert result.status == ABORTED and result.failure_reason.startswith("proxy_error:")
    assert "502" in result.error or "GPU fell off" in result.error
    assert_all_killed(provider)


def test_unreachable_proxy_aborts_with_proxy_error(env, tok):
    provider, base = env
    proxy = ProxyServer(ScriptedEngine(GOOD, tok), tok).start()
    url = proxy.url
    proxy.stop()
    d = Dispatcher(provider, HttpProxyClient(url, timeout=5), evaluator=FakeEvaluator())
    result = d.run_sample(training_row(base), 0)
    assert result.status == ABORTED and result.failure_reason == "proxy_error"
    assert "/session/create" in result.error
    assert_all_killed(provider)


def test_evaluation_exception_aborts_and_kills_both_sandboxes(env, tok):
    provider, base = env
    ev = FakeEvaluator(raise_in_eval=True)
    result, _, _ = run_one(provider, tok, GOOD, training_row(base), evaluator=ev)
    assert result.status == ABORTED and result.failure_reason == "evaluation_error"
    assert "evaluator crashed" in result.error
    assert len(provider.created) == 2 and len(ev.evaluated) == 1
    assert_all_killed(provider)


def test_sandbox_creation_failure_and_bad_rows_abort(env, tok):
    provider, base = env
    provider.fail_create = True
    result, _, _ = run_one(provider, tok, GOOD, training_row(base))
    assert result.status == ABORTED and result.failure_reason == "sandbox_create_failed"
    assert "template image not found" in result.error
    row = training_row(base)
    del row["metadata"]["base_commit"]
    result, _, _ = run_one(provider, tok, GOOD, row)
    assert result.status == ABORTED and result.failure_reason == "bad_row"


def test_group_runs_concurrently_under_the_limit_with_group_indices(env, tok):
    provider, base = env
    in_flight = {"now": 0, "max": 0}
    lock = threading.Lock()

    def slow_policy(prompt_ids: list[int]) -> str:
        with lock:
            in_flight["now"] += 1
            in_flight["max"] = max(in_flight["max"], in_flight["now"])
        threading.Event().wait(0.15)
        with lock:
            in_flight["now"] -= 1
        k = tok.decode(prompt_ids).count("<|im_start|>assistant") - 1
        return GOOD[min(k, 2)]

    with ProxyServer(ScriptedEngine(slow_policy, tok), tok) as proxy:
        d = Dispatcher(
            provider,
            HttpProxyClient(proxy.url, admin_token=proxy.admin_token),
            evaluator=FakeEvaluator(),
            config=RolloutConfig(max_concurrency=2, session_prefix="run7."),
        )
        results = d.run_group(training_row(base), 5)
    assert [r.group_index for r in results] == [0, 1, 2, 3, 4]
    assert all(r.status == COMPLETED and r.reward == 1.0 for r in results), [r.error for r in results]
    assert len({r.session_id for r in results}) == 5
    assert all(r.session_id.startswith("run7.sweflow__calclib-1:") for r in results)
    assert provider.max_live == 2 and in_flight["max"] == 2, "the limit is reached and never exceeded"
    assert_all_killed(provider)


def test_egress_is_the_proxy_only_when_it_listens_on_loopback():
    assert loopback_egress("http://127.0.0.1:8080") == "127.0.0.1:8080"
    assert loopback_egress("http://localhost:9/") == "127.0.0.1:9"
    assert loopback_egress("http://[::1]:7000") == "127.0.0.1:7000"
    assert loopback_egress("https://proxy.example.org") is None  # E2B reaches a public URL
    assert loopback_egress("http://10.0.0.5:8080") is None
    assert loopback_egress("not a url") is None


def test_session_ids_and_patch_stats():
    sid = new_session_id("p" * 10, "x" * 200, 12)
    assert len(sid) <= 128 and sid.split(":")[-2] == "12"
    stats = patch_stats("diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x\n+y\n+z\n")
    assert (stats["files"], stats["lines_added"], stats["lines_removed"]) == (["a.py"], 2, 1)
    with pytest.raises(ValueError):
        Dispatcher(None, None, config=RolloutConfig(max_concurrency=0))  # type: ignore[arg-type]


class InfraFailingEvaluator(FakeEvaluator):
    """The fresh sandbox dies under the evaluation: an EvalResult flagged as infrastructure."""

    def __init__(self, reason: str, error: str | None) -> None:
        super().__init__()
        self.reason, self.error = reason, error

    def evaluate_patch(self, provider, template, metadata, patch):
        from sweflow.grading.evaluate import EvalResult

        fresh = provider.create(template, timeout=60)
        self.evaluated.append(fresh.id)
        fresh.kill()
        return EvalResult(
            0.0, False, self.reason, None, "", {"eval_s": 1.0}, self.error, log="+ cd /testbed\n"
        )


@pytest.mark.parametrize(
    ("reason", "error"), [("sandbox_lost", "the sandbox was killed"), ("eval_not_run", None)]
)
def test_an_infrastructure_failure_of_the_grading_aborts_the_sample_never_reward_0(
    env, tok, tmp_path, reason, error
):
    provider, base = env
    ev = InfraFailingEvaluator(reason, error)
    result, _, _ = run_one(provider, tok, GOOD, training_row(base), evaluator=ev)
    assert (result.status, result.failure_reason) == (ABORTED, "evaluation_error")
    assert result.training_samples() == [], "nothing of this sample reaches the trainer"
    assert reason in result.error and result.evaluation["failure_reason"] == reason
    assert_all_killed(provider)
    from sweflow.grading.evidence import read_evidence

    result.write_evidence(str(tmp_path / "ev.jsonl.gz"))
    [rec] = read_evidence(tmp_path / "ev.jsonl.gz")
    assert (rec["status"], rec["failure_reason"], rec["log"]) == ("aborted", reason, "+ cd /testbed\n")
    assert "evaluation_log" not in result.to_dict()


def test_fresh_evaluator_gives_each_row_its_configured_network():
    from sweflow.rollout.evaluator import FreshEvaluator
    from sweflow.sandbox.settings import NetworkSettings

    class Prov:
        name = "p"

        def __init__(self):
            self.networks = []

        def create(self, template, *, timeout, env=None, metadata=None, network=None):
            self.networks.append(network)
            raise RuntimeError("no sandboxes here")

    from tests.unit.test_evaluate import META

    prov = Prov()
    ev = FreshEvaluator(
        network=NetworkSettings.from_config({"eval": "none", "eval_repos": {META["repo"]: "internet"}}),
        sleep=lambda _s: None,
    )
    res = ev.evaluate_patch(
        prov, "tpl", dict(META), "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    )
    assert res.infra and res.reward == 0.0
    FreshEvaluator(attempts=1).evaluate_patch(prov, "tpl", {**META, "repo": "other/repo"}, "")
    assert prov.networks == ["internet", "internet", "none"]  # an infrastructure failure is retried


class TamperedEvaluator(FakeEvaluator):
    """The fresh evaluation's canaries caught the runner lying: verdict runner_tampered, reward 0."""

    def evaluate_patch(self, provider, template, metadata, patch):
        from types import SimpleNamespace

        fresh = provider.create(template, timeout=60)
        self.evaluated.append(fresh.id)
        fresh.kill()
        marker = {"resolved": False, "failure_reason": "runner_tampered"}
        return SimpleNamespace(reward=0.0, resolved=False, failure_reason="runner_tampered", marker=marker,
                               timings={}, error=None)  # fmt: skip


def recipe_with_price(price: float):
    from sweflow.config import load_config
    from sweflow.train.recipe import Recipe

    return Recipe.from_config(load_config(overrides={"train": {"reward": {"tampered": price}}})["train"])


def test_a_runner_tampered_verdict_gets_the_configured_reward_on_both_engines(env, tok):
    from sweflow.sandbox.settings import SandboxSettings
    from sweflow.train.engines import verl_rollout_spec
    from sweflow.train.proxy_settings import ProxySettings
    from sweflow.train.rollouts import PolicyRollouts
    from sweflow.train.verl_agent_loop import RolloutConfig as SpecConfig

    provider, base = env
    recipe = recipe_with_price(-1.0)
    assert recipe.tampered_reward == -1.0 and recipe_with_price(0).tampered_reward == 0.0
    # TRL: the worker's PolicyRollouts carries the recipe's price into its dispatcher
    with PolicyRollouts(object(), tok, provider, max_new_tokens=8, max_context_tokens=64, temperature=1.0,
                        top_p=1.0, top_k=0, host="127.0.0.1", port=0, public_url=None, max_concurrency=1,
                        turn_timeout=None, session_prefix="r.", eval_network=None, token_build_mode="tito",
                        token_build_model="auto", tampered_reward=recipe.tampered_reward) as pr:  # fmt: skip
        trl_config = pr.dispatcher.config
    # verl: the rollout spec the agent loop builds its dispatcher from
    spec = verl_rollout_spec(recipe, provider="local", sandbox=SandboxSettings.from_config({}),
                             proxy=ProxySettings.from_config({}))  # fmt: skip
    verl_config = SpecConfig.from_spec(spec["rollout"], network=None, router_url=None)
    for config in (trl_config, verl_config):
        assert config.tampered_reward == -1.0
        provider.egresses.clear()  # run_one checks the first sandbox's egress
        result, _, _ = run_one(provider, tok, GOOD, training_row(base), evaluator=TamperedEvaluator(),
                               config=config)  # fmt: skip
        assert (result.status, result.failure_reason) == (COMPLETED, "runner_tampered")
        assert (result.reward, result.resolved) == (-1.0, False)
        assert result.training_samples()[0]["reward"] == -1.0
        assert result.evaluation["reward"] == 0.0, "the grade itself is kept as it was"
    # the recipe's default is 0: a caught forger scores as any unresolved sample
    provider.egresses.clear()
    result, _, _ = run_one(provider, tok, GOOD, training_row(base), evaluator=TamperedEvaluator())
    assert (result.failure_reason, result.reward) == ("runner_tampered", 0.0)


def test_an_integrity_violation_keeps_the_tamper_price_and_other_failures_pay_nothing():
    from sweflow.grading.integrity import Violation, apply_integrity
    from sweflow.grading.reward import RewardResult, price_tampering

    caught = RewardResult(0.0, False, "runner_tampered", {})
    assert price_tampering(caught, -0.5).reward == -0.5
    assert price_tampering(caught, 0.0) is caught
    for other in (RewardResult(0.0, False, "fail_to_pass_failure", {}), RewardResult(1.0, True, None, {})):
        assert price_tampering(other, -0.5) is other
    v = Violation(rule="test_edit", index=2, tool="Edit", detail="tests/test_calc.py")
    both = apply_integrity(price_tampering(caught, -0.5), [v])
    assert (both.reward, both.failure_reason) == (-0.5, "integrity_violation:test_edit")
    assert apply_integrity(RewardResult(1.0, True, None, {}), [v]).reward == 0.0
