"""Token-in/token-out in the proxy: lineages of exact ids, suffix tokenisation, new lineages and why.

Sessions are the recorded real Claude Code sessions (tests/fixtures/trajectories, tests/fixtures/sessions)
replayed call by call (sweflow.proxy.replay) with the tiny tokenizer under two templates: its own and
Qwen3.5's as TRL ships it (`qwen3_5_think.jinja`)."""

from __future__ import annotations

import copy
import gzip
import json
import threading
from pathlib import Path

import pytest

from sweflow.proxy import qwen35_template, replay, tito
from sweflow.proxy.engines import GenerateResult
from sweflow.proxy.server import ProxyConfig, ProxyServer

try:
    from tests.unit.conftest_proxy import tiny_tokenizer
except ModuleNotFoundError:
    from conftest_proxy import tiny_tokenizer  # type: ignore[no-redef]

pytest.importorskip("trl")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RECORDED = FIXTURES / "trajectories" / "claude_code_prediction.json.gz"
REASONING = "I look at the code before I act."


def sessions() -> list[Path]:
    return [RECORDED, *sorted((FIXTURES / "sessions").glob("*.json.gz"))]


def load(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)["turns"]


@pytest.fixture(scope="module")
def tiny():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def qwen(tiny):
    tok = copy.deepcopy(tiny)
    tok.chat_template = tito.trl_template("qwen3_5_think")
    return tok


def test_families_are_detected_from_the_tokenizers_template(tiny, qwen):
    assert tito.detect_family(qwen) == "qwen3_5" and tito.detect_family(tiny) == "generic"
    assert tito.suffix_template("auto", qwen) == qwen35_template.derive(qwen.chat_template)
    assert tito.suffix_template("auto", tiny) is None
    with pytest.raises(ValueError, match="token_build_model"):
        tito.suffix_template("llama", tiny)


@pytest.mark.parametrize("path", sessions(), ids=lambda p: p.name.split(".json")[0])
@pytest.mark.parametrize("template", ["tiny", "qwen3_5"])
def test_an_append_only_claude_code_session_is_one_sample_of_exact_ids(path, template, tiny, qwen):
    tok, reasoning = (tiny, "") if template == "tiny" else (qwen, REASONING)
    turns = load(path)
    out = replay.replay_session(turns, tok, mode="tito", reasoning=reasoning)
    assert out["exact_extension"], out
    assert out["samples"] == 1 and out["lineage_reasons"] == ["first"], out
    assert out["drift_realignments"] == 0
    # every token the model produced is trained on, as produced
    assert out["model_tokens_in_samples"] == out["model_tokens"] > 0


def test_call_k_plus_1_starts_with_call_k_prompt_and_output_and_the_engine_gets_those_ids(qwen):
    turns = load(RECORDED)
    seen: list[tuple[list[int], list[int]]] = []
    orig = replay.ReplayEngine.generate

    def spy(self, prompt_ids, sampling):
        res = orig(self, prompt_ids, sampling)
        seen.append((list(prompt_ids), list(res.output_ids)))
        return res

    replay.ReplayEngine.generate = spy
    try:
        out = replay.replay_session(turns, qwen, mode="tito", reasoning=REASONING)
    finally:
        replay.ReplayEngine.generate = orig
    assert out["samples"] == 1 and len(seen) == len(turns) >= 4
    for (p0, o0), (p1, _o1) in zip(seen, seen[1:], strict=False):
        assert p1[: len(p0) + len(o0)] == p0 + o0
        # what follows is the bridge (the newline after <|im_end|>) and the appended tool results only
        suffix = qwen.decode(p1[len(p0) + len(o0) :])
        assert suffix.startswith("\n<|im_start|>user\n<tool_response>\n"), suffix[:80]
        assert suffix.endswith("<|im_start|>assistant\n<think>\n")
    # the reasoning of every earlier turn stays in the prompt (a re-render would strip it)
    assert qwen.decode(seen[-1][0]).count(REASONING) == len(turns) - 1


def test_a_user_message_splits_the_rerendered_session_but_not_the_tito_one(qwen):
    turns = replay.with_user_note(load(RECORDED), 2, "<system-reminder>Keep going.</system-reminder>")
    before = replay.replay_session(turns, qwen, mode="render", reasoning=REASONING)
    after = replay.replay_session(turns, qwen, mode="tito", reasoning=REASONING)
    # Qwen3.5's template drops the earlier turns' reasoning once a user query follows: the re-render is
    # no prefix of the previous call, and the model's reasoning tokens vanish from the new sample
    assert before["samples"] >= 2, before
    assert after["samples"] == 1 and after["exact_extension"], after
    assert after["model_tokens_in_samples"] == after["model_tokens"]


def test_a_compaction_makes_exactly_one_more_lineage(qwen, tiny):
    for tok, reasoning in ((qwen, REASONING), (tiny, "")):
        out = replay.replay_session(
            replay.compacted(load(RECORDED), 2), tok, mode="tito", reasoning=reasoning
        )
        assert out["samples"] == 2 and out["lineage_reasons"] == ["first", "history_rewrite"], out
        assert out["exact_extension"] and out["model_tokens_in_samples"] == out["model_tokens"]


class Echo:
    """An engine answering a fixed text (and the stop token)."""

    def __init__(self, tok, text="ok"):
        self.ids = list(tok.encode(text, add_special_tokens=False)) + [
            tok.convert_tokens_to_ids("<|im_end|>")
        ]
        self.prompts: list[list[int]] = []
        self.gate: threading.Event | None = None

    def generate(self, prompt_ids, sampling):
        self.prompts.append(list(prompt_ids))
        if self.gate is not None:
            self.gate.wait(10)
        return GenerateResult(list(self.ids), [-1.0] * len(self.ids), "stop")


def _body(messages, tools=None):
    return {"model": "m", "max_tokens": 64, "system": "sys", "messages": messages, "tools": tools or []}


def _followup(first: list[dict], answer: dict, text: str) -> list[dict]:
    return [*first, {"role": "assistant", "content": answer["content"]}, {"role": "user", "content": text}]


def test_other_tools_or_an_edited_earlier_message_start_a_new_lineage(tiny):
    engine = Echo(tiny)
    with ProxyServer(engine, tiny, ProxyConfig()) as proxy:
        proxy.create_session("s")
        first = [{"role": "user", "content": "fix it"}]
        ans, _, _ = proxy.handle_messages("s", _body(first))
        second = _followup(first, ans, "more")
        ans2, _, _ = proxy.handle_messages("s", _body(second))  # append
        tool = {"name": "Bash", "input_schema": {"type": "object", "properties": {}}}
        proxy.handle_messages("s", _body(_followup(second, ans2, "again"), tools=[tool]))
        edited = [{"role": "user", "content": "fix it, please"}]
        proxy.handle_messages("s", _body(_followup(edited, ans, "more")))
        traj = proxy.read_trajectory("s")
    reasons = [t["token_build"] for t in traj["turns"]]
    assert reasons == ["first", "append", "tools_changed", "history_rewrite"]
    assert [s["lineage_reason"] for s in traj["samples"]] == ["first", "tools_changed", "history_rewrite"]
    # the append call's prompt is the first call's exact ids + the bridge + the new user turn only
    p0, p1 = engine.prompts[0], engine.prompts[1]
    assert p1[: len(p0) + len(engine.ids)] == p0 + engine.ids
    assert (
        tiny.decode(p1[len(p0) + len(engine.ids) :])
        == "\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
    )


def test_two_concurrent_calls_on_one_lineage_fork_instead_of_overwriting(tiny):
    engine = Echo(tiny)
    with ProxyServer(engine, tiny, ProxyConfig()) as proxy:
        proxy.create_session("s")
        first = [{"role": "user", "content": "fix it"}]
        ans, _, _ = proxy.handle_messages("s", _body(first))
        engine.gate = threading.Event()
        outs = []
        threads = [
            threading.Thread(
                target=lambda t=t: outs.append(proxy.handle_messages("s", _body(_followup(first, ans, t))))
            )
            for t in ("a", "b")
        ]
        for th in threads:
            th.start()
        while len(engine.prompts) < 3:
            threading.Event().wait(0.01)
        engine.gate.set()
        for th in threads:
            th.join(10)
        traj = proxy.read_trajectory("s")
    assert sorted(t["token_build"] for t in traj["turns"]) == ["append", "concurrent_fork", "first"]
    assert sorted(s["lineage_reason"] for s in traj["samples"]) == ["concurrent_fork", "first"]
    assert len(traj["samples"]) == 2


def test_a_tito_prompt_over_the_limit_is_refused_with_413(tiny):
    from sweflow.proxy.handler import HttpError

    engine = Echo(tiny)
    with ProxyServer(engine, tiny, ProxyConfig(max_prompt_tokens=200)) as proxy:
        proxy.create_session("s")
        first = [{"role": "user", "content": "fix it"}]
        ans, _, _ = proxy.handle_messages("s", _body(first))
        with pytest.raises(HttpError) as err:
            proxy.handle_messages("s", _body(_followup(first, ans, "word " * 400)))
    assert err.value.status == 413 and "too long" in err.value.message


def test_render_mode_keeps_rerendering(tiny):
    out = replay.replay_session(load(RECORDED), tiny, mode="render")
    assert out["lineage_reasons"] == ["render"] and out["samples"] == 1
    with pytest.raises(ValueError, match="token_build_mode"):
        ProxyServer(Echo(tiny), tiny, ProxyConfig(token_build_mode="retokenize"))


def test_the_production_recipe_builds_prompts_as_the_recipes_proxy_does(qwen):
    """config/swegym-e2b.yaml -> train.proxy -> the settings the TRL worker and the verl rollout spec pass
    on: tito with the qwen3_5 family, whose template is the recipe's, derived from the tokenizer's own."""
    from sweflow.config import load_config
    from sweflow.train.proxy_settings import ProxySettings

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "config" / "swegym-e2b.yaml", root / "tests" / "fixtures" / "site.yaml")
    proxy = ProxySettings.from_config(cfg["train"])
    assert (proxy.build_mode, proxy.build_model) == ("tito", "qwen3_5")
    config = ProxyConfig(token_build_mode=proxy.build_mode, token_build_model=proxy.build_model)
    server = ProxyServer(Echo(qwen), qwen, config)
    try:
        assert server._suffix.template == qwen35_template.derive(qwen.chat_template)
        assert server._suffix.recipe and server._suffix.full_template == server._suffix.template
    finally:
        server._httpd.server_close()
    # the embedded default keeps the schema's default: tito, family read from the tokenizer
    assert ProxySettings.from_config({}).build_mode == "tito"


@pytest.mark.parametrize(
    ("text", "opened", "want"),
    [
        ("plan\n</think>\n\nanswer", True, ("plan", "answer")),
        ("<think>plan</think>answer", False, ("plan", "answer")),
        ("cut off mid-thought", True, ("cut off mid-thought", "")),
        ("no reasoning here", False, ("", "no reasoning here")),
        ("a literal </think> with none opened", False, ("", "a literal </think> with none opened")),
        ("\n</think>\n\n<tool_call>x</tool_call>", True, ("", "<tool_call>x</tool_call>")),
    ],
)
def test_reasoning_is_split_as_the_qwen3_reasoning_parser_does(text, opened, want):
    from sweflow.proxy.toolcalls import split_reasoning

    assert split_reasoning(text, opened) == want


@pytest.mark.parametrize("echo_thinking", [True, False])
def test_reasoning_comes_back_as_a_thinking_block_and_the_lineage_holds_its_ids(qwen, echo_thinking):
    """Qwen3.5's generation prompt opens `<think>`: the model's reasoning is a thinking block (before the
    text and tool calls), never text; whether the agent echoes it or drops it, the next call extends the
    lineage with the model's own reasoning tokens."""
    from sweflow.proxy import anthropic as an

    tool = {"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
    call = "<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>"
    engine = Echo(qwen, f"{REASONING}\n</think>\n\nLooking.\n{call}")
    with ProxyServer(engine, qwen, ProxyConfig()) as proxy:
        proxy.create_session("s")
        first = [{"role": "user", "content": "fix it"}]
        ans, _, _ = proxy.handle_messages("s", {**_body(first, [tool])})
        kinds = [b["type"] for b in ans["content"]]
        assert kinds == ["thinking", "text", "tool_use"], ans["content"]
        assert ans["content"][0]["thinking"] == REASONING and ans["content"][1]["text"] == "Looking."
        assert ans["content"][0]["signature"] and REASONING not in json.dumps(ans["content"][1:])
        stream = [d["delta"] for e, d in an.sse_events(ans) if e == "content_block_delta"]
        assert stream[0] == {"type": "thinking_delta", "thinking": REASONING}
        echoed = ans["content"] if echo_thinking else ans["content"][1:]
        use = ans["content"][2]
        second = [
            *first,
            {"role": "assistant", "content": echoed},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "a.py"}],
            },
        ]
        proxy.handle_messages("s", _body(second, [tool]))
        traj = proxy.read_trajectory("s")
    assert [t["token_build"] for t in traj["turns"]] == ["first", "append"]
    [sample] = traj["samples"]
    assert qwen.decode(sample["token_ids"]).count(REASONING) == 2
    p0, p1 = engine.prompts
    assert p1[: len(p0) + len(engine.ids)] == p0 + engine.ids
