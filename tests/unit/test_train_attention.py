"""Blockwise sliding-window attention gives the same logits as SDPA with the full mask (padding included),
and the same sampled tokens through the proxy's engine."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from sweflow.offline.tiny_model import build_tiny_model
    from sweflow.train.attention import attention_for

    path = build_tiny_model(tmp_path_factory.mktemp("swa") / "m", "tiny-swa")
    sdpa = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    name = attention_for(sdpa.config)
    assert name == "sweflow_blockwise"
    blockwise = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation=name)
    return sdpa, blockwise


def test_blockwise_matches_sdpa_with_left_padding(models):
    sdpa, blockwise = models
    torch.manual_seed(0)
    ids = torch.randint(0, 500, (2, 1500))
    mask = torch.ones_like(ids)
    mask[1, :333] = 0
    with torch.no_grad():
        a = sdpa(input_ids=ids, attention_mask=mask).logits
        b = blockwise(input_ids=ids, attention_mask=mask).logits
    assert (a - b)[mask.bool()].abs().max() < 1e-4


def test_blockwise_samples_the_same_tokens(models):
    from sweflow.proxy.engines import SamplingParams, TransformersEngine

    sdpa, blockwise = models
    prompt = torch.randint(0, 500, (900,)).tolist()
    sp = SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    a = TransformersEngine(sdpa).generate(prompt, sp)
    b = TransformersEngine(blockwise).generate(prompt, sp)
    assert a.output_ids == b.output_ids
    assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


def test_full_attention_models_keep_their_implementation():
    from transformers import Qwen3Config

    from sweflow.train.attention import attention_for

    assert attention_for(Qwen3Config(num_hidden_layers=2)) is None
