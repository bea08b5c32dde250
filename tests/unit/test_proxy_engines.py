"""Engines: vLLM over HTTP (against a fake server), transformers logprobs vs a forward pass, scripted."""

from __future__ import annotations

import pytest

from sweflow.offline.scripted_engine import ScriptedEngine, scripted_logprob
from sweflow.proxy.engines import (
    EngineError,
    EngineTimeout,
    GenerateResult,
    SamplingParams,
    VLLMEngine,
)

try:
    from tests.unit.conftest_proxy import FakeVLLM, tiny_model_path, tiny_tokenizer
except ModuleNotFoundError:  # default import mode: tests/unit itself is on sys.path
    from conftest_proxy import FakeVLLM, tiny_model_path, tiny_tokenizer  # type: ignore[no-redef]


@pytest.mark.parametrize("mode", ["token_ids", "tokens_only"])
def test_vllm_engine_reads_ids_and_logprobs(mode):
    with FakeVLLM(mode=mode, n_out=3) as fake:
        engine = VLLMEngine(fake.url + "/v1", "qwen", timeout=5)
        res = engine.generate([10, 11, 12], SamplingParams(max_tokens=8, temperature=0.7, stop_token_ids=[2]))
    assert res.output_ids == [16, 17, 2] and res.finish_reason == "stop"
    assert res.logprobs == [-0.5, -0.75, -1.0]
    sent = fake.requests[0]
    assert sent["path"] == "/v1/completions"
    body = sent["body"]
    assert body["prompt"] == [10, 11, 12] and body["logprobs"] == 1 and body["return_tokens_as_token_ids"]
    assert body["temperature"] == 0.7 and body["max_tokens"] == 8 and body["stop_token_ids"] == [2]


def test_vllm_engine_length_finish():
    with FakeVLLM(n_out=10) as fake:
        res = VLLMEngine(fake.url, "m").generate([1], SamplingParams(max_tokens=4))
    assert len(res.output_ids) == 4 and res.finish_reason == "length"


def test_vllm_engine_http_error_and_unreachable():
    with FakeVLLM(mode="error") as fake:
        with pytest.raises(EngineError, match="HTTP 500"):
            VLLMEngine(fake.url, "m").generate([1], SamplingParams())
        url = fake.url
    with pytest.raises(EngineError, match="unreachable"):
        VLLMEngine(url, "m", timeout=2).generate([1], SamplingParams())


def test_vllm_engine_timeout():
    with FakeVLLM(delay=1.0) as fake:
        with pytest.raises(EngineTimeout):
            VLLMEngine(fake.url, "m", timeout=0.2).generate([1], SamplingParams())


def test_vllm_parse_rejects_text_tokens_and_missing_logprobs():
    with pytest.raises(EngineError, match="token_id"):
        VLLMEngine.parse_completion(
            {"choices": [{"logprobs": {"tokens": ["hello"], "token_logprobs": [-1.0]}}]}
        )
    with pytest.raises(EngineError, match="token_logprobs"):
        VLLMEngine.parse_completion({"choices": [{"token_ids": [1], "logprobs": None}]})
    with pytest.raises(EngineError, match="no choices"):
        VLLMEngine.parse_completion({"error": "x"})


def test_generate_result_length_mismatch_is_an_error():
    with pytest.raises(EngineError):
        GenerateResult([1, 2], [0.0], "stop")


def test_scripted_engine_replays_turns_with_rule_logprobs():
    tok = tiny_tokenizer()
    engine = ScriptedEngine(["hello world", "second"], tok)
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    res = engine.generate([1, 2], SamplingParams(stop_token_ids=[stop]))
    assert res.output_ids[-1] == stop and res.finish_reason == "stop"
    assert tok.decode(res.output_ids[:-1]) == "hello world"
    assert res.logprobs == [scripted_logprob(t, i) for i, t in enumerate(res.output_ids)]
    assert all(-1.0 <= lp < 0 for lp in res.logprobs)
    short = engine.generate([1], SamplingParams(max_tokens=1, stop_token_ids=[stop]))
    assert len(short.output_ids) == 1 and short.finish_reason == "length"
    with pytest.raises(EngineError, match="call 3"):
        engine.generate([1], SamplingParams())


def test_scripted_engine_callable_and_cycle():
    tok = tiny_tokenizer()
    echo = ScriptedEngine(lambda ids: f"n={len(ids)}", tok)
    assert tok.decode(echo.generate([5, 6, 7], SamplingParams()).output_ids) == "n=3"
    cyc = ScriptedEngine(["a"], tok, cycle=True)
    for _ in range(3):
        assert tok.decode(cyc.generate([1], SamplingParams()).output_ids) == "a"


@pytest.fixture(scope="module")
def tiny_engine():
    pytest.importorskip("torch")
    from sweflow.proxy.engines import TransformersEngine

    return TransformersEngine(tiny_model_path())


def test_transformers_logprobs_match_forward_pass(tiny_engine):
    import torch

    tok = tiny_tokenizer()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "fix the bug"}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    res = tiny_engine.generate(prompt_ids, SamplingParams(max_tokens=12, temperature=1.0, seed=3))
    assert len(res.output_ids) == len(res.logprobs) > 0
    full = torch.tensor([prompt_ids + res.output_ids])
    with torch.no_grad():
        logp = torch.log_softmax(tiny_engine.model(full).logits[0].float(), dim=-1)
    n = len(prompt_ids)
    expected = [float(logp[n - 1 + k, t]) for k, t in enumerate(res.output_ids)]
    assert res.logprobs == pytest.approx(expected, abs=1e-4)


def test_transformers_seeded_and_greedy_and_stop(tiny_engine):
    prompt = [1, 5, 6, 7]
    a = tiny_engine.generate(prompt, SamplingParams(max_tokens=6, seed=11))
    b = tiny_engine.generate(prompt, SamplingParams(max_tokens=6, seed=11))
    assert a.output_ids == b.output_ids and a.finish_reason == "length"
    greedy = tiny_engine.generate(prompt, SamplingParams(max_tokens=3, temperature=0))
    # greedy picks the argmax: its logprob is the row maximum, so no other token is more likely
    import torch

    with torch.no_grad():
        first = torch.log_softmax(tiny_engine.model(torch.tensor([prompt])).logits[0, -1], -1)
    assert greedy.output_ids[0] == int(first.argmax())
    stop_at = greedy.output_ids[1]
    stopped = tiny_engine.generate(
        prompt, SamplingParams(max_tokens=3, temperature=0, stop_token_ids=[stop_at])
    )
    first_stop = greedy.output_ids.index(stop_at)
    assert stopped.output_ids == greedy.output_ids[: first_stop + 1] and stopped.finish_reason == "stop"


def test_transformers_top_k_one_equals_greedy(tiny_engine):
    prompt = [1, 9, 8]
    greedy = tiny_engine.generate(prompt, SamplingParams(max_tokens=4, temperature=0))
    topk = tiny_engine.generate(prompt, SamplingParams(max_tokens=4, temperature=1.0, top_k=1, seed=0))
    top_p = tiny_engine.generate(prompt, SamplingParams(max_tokens=4, temperature=1.0, top_p=1e-6, seed=0))
    assert greedy.output_ids == topk.output_ids == top_p.output_ids
