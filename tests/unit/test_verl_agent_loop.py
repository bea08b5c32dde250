"""SweflowAgentLoop, built the way verl 0.9.1 builds agent loops, turns dispatcher rollouts into verl outputs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
from pathlib import Path

import pytest

# verl 0.9.1 and transferqueue install a top-level `tests` package into site-packages, which shadows
# this repository's: put the repository first and forget a foreign `tests` before importing ours.
_ROOT = str(Path(__file__).resolve().parents[2])
if sys.path[:1] != [_ROOT]:
    sys.path.insert(0, _ROOT)
if not str(getattr(sys.modules.get("tests"), "__file__", _ROOT)).startswith(_ROOT):
    del sys.modules["tests"]
from tests.unit.conftest_proxy import tiny_tokenizer  # noqa: E402

pytest.importorskip("verl")

import hydra  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap, ToolListWrap  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from sweflow.proxy.engines import SamplingParams  # noqa: E402
from sweflow.proxy.recorder import Turn, linearize  # noqa: E402
from sweflow.rollout.types import RolloutResult  # noqa: E402
from sweflow.train import verl_agent_loop as val  # noqa: E402
from sweflow.train.recipe import Parallel, Recipe  # noqa: E402
from sweflow.train.verl_engine import AGENT_LOOP_TARGET, compose_verl_config, verl_overrides  # noqa: E402

VERL_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
ROW = {"prompt": [{"role": "user", "content": "fix it"}], "metadata": {"instance_id": "o__r-1"}}


class ScriptedServerManager:
    """verl's LLMServerClient.generate, scripted: turn k answers OUTPUTS[k] with logprob -(id / 100)."""

    def __init__(self, outputs: list[list[int]], version: int = 3) -> None:
        self.outputs, self.version, self.calls = outputs, version, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        await asyncio.sleep(0)
        ids = self.outputs[len(self.calls) % len(self.outputs)]
        self.calls.append(
            {"request_id": request_id, "prompt_ids": list(prompt_ids), "params": dict(sampling_params)}
        )
        return TokenOutput(
            token_ids=list(ids),
            log_probs=[-(i / 100) for i in ids],
            stop_reason="completed",
            extra_fields={"global_steps": self.version},
        )


def composed_config(**lengths):
    recipe = Recipe(
        engine="verl", parallel=Parallel(nodes=1, gpus_per_node=8, tensor=2, context=1), **lengths
    )
    return compose_verl_config(
        verl_overrides(
            recipe,
            train_files="/d/t.parquet",
            val_files="/d/v.parquet",
            model_path="/m",
            out_dir="/o",
            agent_loop_config="/o/loops.yaml",
        )
    )


@pytest.fixture(scope="module")
def trainer_config():
    # a sample: its first prompt + at most 13 - prompt tokens after it; 12 tokens per call (the spec's)
    return composed_config(max_context_tokens=13, max_prompt_tokens=8, max_response_tokens=12)


@pytest.fixture(scope="module")
def roomy_config():
    """Room for a real chat template's prompt."""
    return composed_config(max_context_tokens=4096, max_prompt_tokens=2048, max_response_tokens=64)


@pytest.fixture(autouse=True)
def fresh_runtime(monkeypatch, tmp_path):
    monkeypatch.setenv(val.ROLLOUT_LOG_ENV, str(tmp_path / "rollouts"))
    val.reset_runtime()
    val.ABORTED.clear()
    yield
    val.reset_runtime()


def instantiate(trainer_config, server_manager, tokenizer):
    """Exactly the call in verl's AgentLoopWorker._run_agent_loop."""
    return hydra.utils.instantiate(
        config={"_target_": AGENT_LOOP_TARGET},
        trainer_config=DictConfigWrap(config=trainer_config),
        server_manager=server_manager,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(trainer_config.data),
        tools=ToolListWrap([]),
    )


def run_loop(trainer_config, server_manager, scripted_sample, **row_extra):
    """Instantiate the loop inside a running event loop (as verl does) and run one sample; the dispatcher
    is replaced by `scripted_sample(engine, row, group_index, prefix) -> RolloutResult`."""

    def factory(agent):
        engine = val.ServerManagerEngine(agent.server_manager, agent.loop, timeout=30)
        pool = concurrent.futures.ThreadPoolExecutor(2)
        return val.Runtime(engine, lambda r, g, p: scripted_sample(engine, r, g, p), pool)

    async def main():
        agent = instantiate(trainer_config, server_manager, tiny_tokenizer())
        kwargs = {
            "sweflow_row": json.dumps(ROW),
            "uid": "uid-7",
            "session_id": 2,
            "global_steps": 4,
            **row_extra,
        }
        return await agent.run(dict(VERL_SAMPLING), **kwargs)

    val.RUNTIME_FACTORY = factory
    try:
        return asyncio.run(main())
    finally:
        val.RUNTIME_FACTORY = val.build_runtime


def two_turn_session(engine, prefix, *, prompt, tool, stop=2, compact=False):
    """Drive the engine like the proxy: turn 1 on `prompt`, then turn 2 on prompt + output + tool tokens
    (or, compacted, on a fresh prompt); linearise the turns with the proxy's recorder."""
    session = f"{prefix}o__r-1:2:abcd1234"
    sp = SamplingParams(max_tokens=8, stop_token_ids=[stop], request_id=session)
    r1 = engine.generate(prompt, sp)
    second = [7, 7, 7] if compact else prompt + r1.output_ids + tool
    r2 = engine.generate(second, sp)
    turns = [
        Turn(0, list(prompt), r1.output_ids, r1.logprobs, r1.finish_reason),
        Turn(1, list(second), r2.output_ids, r2.logprobs, r2.finish_reason),
    ]
    return session, linearize(turns)


def test_multi_turn_session_gives_ids_masks_logprobs_and_reward(trainer_config):
    sm = ScriptedServerManager([[11, 12, 2], [13, 2]])
    prompt, tool = [1, 5, 6], [40, 41, 42]

    def sample(engine, row, g, prefix):
        assert row == ROW and g == 2
        session, samples = two_turn_session(engine, prefix, prompt=prompt, tool=tool)
        return RolloutResult(
            "o__r-1", g, session, "completed", None, reward=1.0, resolved=True, samples=samples, num_turns=2
        )

    outs = run_loop(trainer_config, sm, sample)
    assert isinstance(outs, list) and len(outs) == 1 and isinstance(outs[0], AgentLoopOutput)
    out = outs[0]
    assert out.prompt_ids == prompt
    assert out.response_ids == [11, 12, 2, 40, 41, 42, 13, 2]
    assert out.response_mask == [1, 1, 1, 0, 0, 0, 1, 1]  # tool-output tokens are not trained on
    assert out.response_logprobs == pytest.approx([-0.11, -0.12, -0.02, 0.0, 0.0, 0.0, -0.13, -0.02])
    assert out.reward_score == 1.0 and out.num_turns == 2
    assert out.extra_fields["min_global_steps"] == out.extra_fields["max_global_steps"] == 3
    assert out.extra_fields["reward_extra_info"] == {"resolved": 1.0}
    assert out.extra_fields["sweflow"]["group"] == "uid-7" and out.extra_fields["sweflow"]["aborted"] is False
    # Both turns went to the server manager under the proxy session id (sticky), with verl's sampling.
    assert [c["request_id"] for c in sm.calls] == [sm.calls[0]["request_id"]] * 2
    assert sm.calls[0]["request_id"].endswith("o__r-1:2:abcd1234")
    params = sm.calls[0]["params"]
    assert params["logprobs"] is True and params["top_k"] == -1 and params["max_tokens"] == 8
    assert params["stop_token_ids"] == [2]
    # verl's v1 worker turns each output into tensors with as_dict(): rollout_log_probs feed the TIS.
    d = out.as_dict()
    assert d["rollout_log_probs"].tolist() == pytest.approx(out.response_logprobs)
    assert d["rm_scores"].tolist()[-1] == 1.0


def test_a_session_the_proxy_split_gives_one_output_per_sample(trainer_config):
    sm = ScriptedServerManager([[11, 2], [13, 14, 2]])

    def sample(engine, row, g, prefix):
        session, samples = two_turn_session(engine, prefix, prompt=[1, 5], tool=[40], compact=True)
        assert len(samples) == 2
        return RolloutResult(
            "o__r-1", g, session, "completed", "f2p_failed", reward=0.0, samples=samples, num_turns=2
        )

    outs = run_loop(trainer_config, sm, sample)
    assert [o.prompt_ids for o in outs] == [[1, 5], [7, 7, 7]]
    assert [o.response_ids for o in outs] == [[11, 2], [13, 14, 2]]
    assert [o.reward_score for o in outs] == [0.0, 0.0]
    assert [o.extra_fields["sweflow"]["sample"] for o in outs] == [0, 1]


def test_a_long_sample_is_cut_to_the_context_window(trainer_config):
    sm = ScriptedServerManager([[11, 12, 13, 14, 15, 16, 17, 2], [20, 21, 22, 23, 2]])

    def sample(engine, row, g, prefix):
        session, samples = two_turn_session(engine, prefix, prompt=[1], tool=[40, 41, 42])
        return RolloutResult("o__r-1", g, session, "completed", None, reward=1.0, samples=samples)

    (out,) = run_loop(trainer_config, sm, sample)
    rollout = trainer_config.actor_rollout_ref.rollout
    assert rollout.max_model_len == rollout.response_length == 13  # the context window
    # the whole sample holds 13 tokens: the 1-token prompt and 12 after it
    assert len(out.prompt_ids) + len(out.response_ids) == 13
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs) == 12
    assert out.response_mask == [1] * 8 + [0, 0, 0] + [1]
    assert out.extra_fields["sweflow"]["truncated"] is True


def test_an_aborted_sample_is_dropped_counted_and_logged_never_scored(trainer_config, tmp_path):
    sm = ScriptedServerManager([[11, 2]])

    def sample(engine, row, g, prefix):
        return RolloutResult("o__r-1", g, f"{prefix}o__r-1:2:x", "aborted", "sandbox_died", error="gone")

    assert run_loop(trainer_config, sm, sample) == []
    assert val.ABORTED == {"sandbox_died": 1}
    (log_file,) = (tmp_path / "rollouts").glob("*.jsonl")
    rec = json.loads(log_file.read_text())
    assert rec["aborted"] is True and rec["failure_reason"] == "sandbox_died" and rec["step"] == 4
    assert rec["group"] == "uid-7" and rec["instance"] == "o__r-1" and rec["reward"] == 0.0
    assert "patch" not in rec and "token_ids" not in json.dumps(rec)


def test_the_rollout_log_has_one_line_per_finished_sample(trainer_config, tmp_path):
    sm = ScriptedServerManager([[11, 2], [13, 2]])

    def sample(engine, row, g, prefix):
        session, samples = two_turn_session(engine, prefix, prompt=[1, 5], tool=[40])
        return RolloutResult(
            "o__r-1", g, session, "completed", None, reward=1.0, resolved=True, samples=samples, num_turns=2
        )

    run_loop(trainer_config, sm, sample)
    (log_file,) = (tmp_path / "rollouts").glob("*.jsonl")
    rec = json.loads(log_file.read_text())
    assert (rec["aborted"], rec["reward"], rec["resolved"], rec["turns"], rec["samples"]) == (
        False,
        1.0,
        True,
        2,
        1,
    )
    assert rec["prompt_tokens"] == 2 and rec["response_tokens"] == 4  # [11, 2] and [13, 2] are model tokens


def test_the_real_proxy_bridges_anthropic_requests_to_the_server_manager(roomy_config):
    """A real ProxyServer over the ServerManagerEngine: an Anthropic Messages request becomes a sticky
    server-manager call (request id = the proxy session) and the recorded sample becomes the output."""
    anthropic = pytest.importorskip("anthropic")
    from sweflow.proxy.server import ProxyConfig, ProxyServer
    from sweflow.rollout.clients import HttpProxyClient

    tok = tiny_tokenizer()
    text_ids = tok.encode("All done.", add_special_tokens=False)
    stop = tok.eos_token_id if tok.eos_token_id is not None else 2
    sm = ScriptedServerManager([text_ids + [stop]])
    servers = []

    def factory(agent):
        engine = val.ServerManagerEngine(agent.server_manager, agent.loop, timeout=30)
        proxy = ProxyServer(
            engine, agent.tokenizer, ProxyConfig(max_new_tokens=32, stop_token_ids=[stop])
        ).start()
        client = HttpProxyClient(proxy.url, admin_token=proxy.admin_token)
        servers.append(proxy)

        def run_sample(row, g, prefix):
            session = f"{prefix}o__r-1:{g}:feedbeef"
            token = client.create_session(session)
            api = anthropic.Anthropic(base_url=proxy.url, auth_token=token, api_key=None, max_retries=0)
            msg = api.messages.create(
                model="policy", max_tokens=64, messages=[{"role": "user", "content": "fix it"}]
            )
            assert msg.content[0].text == "All done."
            client.finalize_session(session)
            traj = client.read_trajectory(session)
            return RolloutResult(
                "o__r-1", g, session, "completed", None, reward=1.0, samples=traj["samples"], num_turns=1
            )

        pool = concurrent.futures.ThreadPoolExecutor(2)
        return val.Runtime(engine, run_sample, pool, closers=[proxy.stop])

    async def main():
        agent = instantiate(roomy_config, sm, tok)
        return await agent.run(
            dict(VERL_SAMPLING), sweflow_row=json.dumps(ROW), uid="u", session_id=0, global_steps=1
        )

    val.RUNTIME_FACTORY = factory
    try:
        (out,) = asyncio.run(main())
    finally:
        val.RUNTIME_FACTORY = val.build_runtime
    (call,) = sm.calls
    assert call["request_id"].startswith("v") and call["request_id"].endswith("o__r-1:0:feedbeef")
    assert out.prompt_ids == call["prompt_ids"]  # the proxy's rendering of the request is the prompt
    assert out.response_ids == text_ids + [stop] and out.response_mask == [1] * (len(text_ids) + 1)
    assert out.response_logprobs == pytest.approx([-(i / 100) for i in text_ids + [stop]])
    assert call["params"]["stop_token_ids"] == [stop] and call["params"]["max_tokens"] <= 32


def test_the_engine_refuses_to_block_its_own_event_loop():
    sm = ScriptedServerManager([[1]])

    async def main():
        engine = val.ServerManagerEngine(sm, asyncio.get_running_loop())
        with pytest.raises(val.EngineError, match="deadlock"):
            engine.generate([1], SamplingParams(max_tokens=2))

    asyncio.run(main())


def test_a_rollout_spec_with_a_secret_or_an_unknown_key_is_refused(tmp_path):
    good = {
        "provider": "docker",
        "sandbox": {"docker": {"cpus": 2}},
        "proxy": {"host": "127.0.0.1"},
        "rollout": {"max_concurrency": 4},
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(good))
    assert val.load_rollout_spec(path)["provider"] == "docker"
    path.write_text(json.dumps({**good, "sandbox": {"e2b": {"api_key": "e2b_live_123456789"}}}))
    with pytest.raises(val.ConfigError, match="secret"):
        val.load_rollout_spec(path)
    path.write_text(json.dumps({**good, "rollout": {"max_concurrency": 4, "typo_timeout": 3}}))
    with pytest.raises(val.ConfigError, match="typo_timeout"):
        val.load_rollout_spec(path)


def test_fresh_evaluations_get_the_configured_network_as_on_the_trl_engine():
    from sweflow.sandbox.settings import SandboxSettings

    sandbox = SandboxSettings.from_config({"network": {"eval": "internet", "eval_repos": {"a/b": "none"}}})
    cfg = val.RolloutConfig.from_spec(
        {"max_concurrency": 3}, network=sandbox.network, router_url="http://proxy:1"
    )
    assert cfg.eval_network == sandbox.network and cfg.eval_network.eval == "internet"
    assert cfg.max_concurrency == 3 and cfg.router_url == "http://proxy:1"
    none = SandboxSettings.from_config({}).network
    assert val.RolloutConfig.from_spec({}, network=none, router_url=None).eval_network.eval == "none"


def test_a_caught_forger_is_scored_the_price_and_counted_as_a_tamper_verdict(trainer_config, tmp_path):
    from sweflow.train.verl_metrics import rollout_log_stats

    sm = ScriptedServerManager([[11, 2], [13, 2]])

    def sample(engine, row, g, prefix):  # the dispatcher priced the verdict (train.reward.tampered = -1)
        session, samples = two_turn_session(engine, prefix, prompt=[1, 5], tool=[40])
        return RolloutResult("o__r-1", g, session, "completed", "runner_tampered", reward=-1.0, resolved=False,
                             samples=samples, num_turns=2)  # fmt: skip

    outputs = run_loop(trainer_config, sm, sample)
    assert outputs and all(o.reward_score == -1.0 for o in outputs), "verl trains on the price as it is"
    stats = rollout_log_stats(tmp_path / "rollouts")[4]
    assert stats["tampered"] == 1 and stats["tampered_by_reason"]["runner_tampered"] == 1
    assert set(stats["tampered_by_reason"]) >= {"suspicious_test_tampering", "integrity_violation"}
