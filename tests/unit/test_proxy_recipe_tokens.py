"""The proxy builds the recipe's token ids (build_model qwen3_5): checked against a plain re-implementation of
the recipe's method, on the recorded Claude Code sessions and on synthetic edge cases.

The recipe (Dressage's TITO, `TOKEN_BUILD_MODEL=qwen3_5`) renders with its own fixed Qwen3.5 template (no
second example parameter, no closing reminder block, every assistant turn's reasoning kept):

- a call that extends no earlier call: the whole conversation rendered;
- otherwise the call whose rendered history (its messages + its answer) is the longest prefix of the
  request's rendering is extended: its exact prompt + output ids, a newline after a final `<|im_end|>`
  (nothing after an output cut by the length limit), then each appended run of tool results and each user
  message rendered after a dummy prefix and tokenised on its own, then the generation prompt. Extending a
  lineage's last call continues the lineage; extending an earlier call starts a new one (a branch).

`RecipeTokens` below redoes that with a template written here in Python (`recipe_render`), so neither the
jinja template the proxy derives nor its lineage code is used to check them. The tokenizer is the tiny
fixture one with the stock Qwen3.5 template (TRL's copy, as a Qwen3.5 checkpoint ships it).
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from sweflow.proxy import prompting, qwen35_template, replay, tito
from sweflow.proxy.engines import GenerateResult
from sweflow.proxy.server import ProxyConfig, ProxyServer

try:
    from tests.unit.conftest_proxy import tiny_tokenizer
except ModuleNotFoundError:
    from conftest_proxy import tiny_tokenizer  # type: ignore[no-redef]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REASONING = "I look at the code before I act."
STOCK = qwen35_template.trl_stock_template()  # the stock Qwen3.5 template, as TRL copies it


def sessions() -> list[Path]:
    return [FIXTURES / "trajectories" / "claude_code_prediction.json.gz", *sorted((FIXTURES / "sessions").glob("*.json.gz"))]  # fmt: skip


def load(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)["turns"]


def qwen_tokenizer():
    """The tiny tokenizer with the stock Qwen3.5 chat template (what a Qwen3.5 checkpoint ships)."""
    if STOCK is None:
        pytest.skip("needs the stock Qwen3.5 template (TRL's qwen3_5_think.jinja) as the tokenizer's own")
    tok = copy.deepcopy(tiny_tokenizer())
    tok.chat_template = STOCK
    return tok


# ---------------------------------------------------------------- the recipe's template, in Python
TOOL_INSTRUCTIONS = (
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n</function>\n</tool_call>"
)


def _arg_text(value: Any) -> str:
    # jinja: mappings and non-string sequences as JSON, anything else through `string` (str())
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def recipe_render(messages: list[dict], tools: list | None, generation: bool) -> str:
    """Text-only chat messages as the recipe's fixed Qwen3.5 template renders them (thinking kept)."""
    out: list[str] = []
    first = messages[0]
    if tools:
        out.append("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>")
        out += ["\n" + json.dumps(tool, ensure_ascii=False) for tool in tools]
        out.append("\n</tools>" + TOOL_INSTRUCTIONS)
        if first["role"] == "system" and first["content"].strip():
            out.append("\n\n" + first["content"].strip())
        out.append("<|im_end|>\n")
    elif first["role"] == "system":
        out.append("<|im_start|>system\n" + first["content"].strip() + "<|im_end|>\n")
    for i, msg in enumerate(messages):
        role, content = msg["role"], (msg.get("content") or "").strip()
        if role == "system":
            if i:
                raise ValueError("a system message after the first")
        elif role == "user":
            out.append(f"<|im_start|>user\n{content}<|im_end|>\n")
        elif role == "assistant":
            reasoning = msg.get("reasoning_content")
            if not isinstance(reasoning, str):
                reasoning = ""
                if "</think>" in content:
                    reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
                    content = content.split("</think>")[-1].lstrip("\n")
            out.append(f"<|im_start|>assistant\n<think>\n{reasoning.strip()}\n</think>\n\n{content}")
            for k, call in enumerate(msg.get("tool_calls") or []):
                fn = call.get("function", call)
                lead = ("\n\n" if content.strip() else "") if k == 0 else "\n"
                out.append(f"{lead}<tool_call>\n<function={fn['name']}>\n")
                for name, value in (fn.get("arguments") or {}).items():
                    out.append(f"<parameter={name}>\n{_arg_text(value)}\n</parameter>\n")
                out.append("</function>\n</tool_call>")
            out.append("<|im_end|>\n")
        elif role == "tool":
            if i and messages[i - 1]["role"] != "tool":
                out.append("<|im_start|>user")
            out.append(f"\n<tool_response>\n{content}\n</tool_response>")
            if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
                out.append("<|im_end|>\n")
        else:
            raise ValueError(f"unexpected role {role!r}")
    if generation:
        out.append("<|im_start|>assistant\n<think>\n")
    return "".join(out)


# ---------------------------------------------------------------- the recipe's method
class Refused(Exception):
    """An appended message the recipe does not tokenise as a suffix (it renders the whole prompt)."""


class RecipeTokens:
    """The recipe's prompt ids, call by call (module docstring)."""

    DUMMY_SYSTEM = {"role": "system", "content": "dummy system"}

    def __init__(self, tok) -> None:
        self.tok = tok
        self.im_end = tok.convert_tokens_to_ids("<|im_end|>")
        [self.newline] = tok.encode("\n", add_special_tokens=False)
        self.steps: list[dict] = []
        self.latest: dict[int, int] = {}  # lineage -> its last step

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def _diff(self, base: list[dict], appended: list[dict], tools, generation: bool = False) -> list[int]:
        head = recipe_render(base, tools, False)
        full = recipe_render(base + appended, tools, generation)
        assert full.startswith(head)
        return self.encode(full[len(head) :])

    def _appended(self, chat: list[dict], appended: list[dict], tools) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(appended):
            role = appended[i]["role"]
            if role == "tool":
                j = i
                while j < len(appended) and appended[j]["role"] == "tool":
                    j += 1
                calls = [
                    {
                        "id": m.get("tool_call_id") or f"call0000{k}",
                        "type": "function",
                        "function": {"name": m.get("name") or "dummy_func", "arguments": {}},
                    }
                    for k, m in enumerate(appended[i:j])
                ]
                dummy = {"role": "assistant", "content": "", "reasoning_content": " ", "tool_calls": calls}
                ids += self._diff([self.DUMMY_SYSTEM, dummy], appended[i:j], tools)
                i = j
            elif role == "user":
                ids += self._diff([self.DUMMY_SYSTEM], [appended[i]], tools)
                i += 1
            else:
                raise Refused(role)
        return ids + self._diff(chat, [], tools, generation=True)

    def prompt(self, chat: list[dict], tools) -> tuple[list[int], str, int | None]:
        """(prompt ids, route: create | append | branch, the step extended)."""
        current = recipe_render(chat, tools, True)
        fits = [
            i for i, s in enumerate(self.steps) if s["tools"] == tools and current.startswith(s["rendered"])
        ]
        if fits:
            best = max(fits, key=lambda i: (len(self.steps[i]["rendered"]), self.latest[self.steps[i]["lineage"]] == i, i))  # fmt: skip
            step = self.steps[best]
            prefix = list(step["prompt_ids"]) + list(step["output_ids"])
            if prefix and prefix[-1] == self.im_end:
                prefix.append(self.newline)
            try:
                ids = prefix + self._appended(chat, chat[len(step["chat"]) + 1 :], tools)
            except Refused:
                return self.encode(current), "create", None
            return ids, "append" if self.latest[step["lineage"]] == best else "branch", best
        return self.encode(current), "create", None

    def record(self, chat, tools, answer, prompt_ids, output_ids, route: str, base: int | None) -> None:
        lineage = self.steps[base]["lineage"] if route == "append" else len(self.latest)
        rendered = recipe_render([*chat, answer], tools, False)
        self.steps.append(
            {"chat": chat, "tools": tools, "rendered": rendered, "lineage": lineage}
            | {"prompt_ids": prompt_ids, "output_ids": output_ids}
        )
        self.latest[lineage] = len(self.steps) - 1


# ---------------------------------------------------------------- the proxy's calls, captured
class Capture:
    """What the proxy built for each call: chat, tools, prompt ids, how (token_build), answer, output."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[dict] = []
        build, commit = prompting.PromptBuilding.build_prompt, tito.LineageBook.commit
        cap = self

        def spy_build(self, req, rec):
            ids, plan, chat, tools = build(self, req, rec)
            cap.calls.append({"prompt_ids": list(ids), "chat": copy.deepcopy(chat), "tools": tools or None})
            return ids, plan, chat, tools

        def spy_commit(self, plan, **kw):
            out = commit(self, plan, **kw)
            cap.calls[-1].update(answer=kw["answer"], output_ids=list(kw["output_ids"]), build=out[1])
            return out

        monkeypatch.setattr(prompting.PromptBuilding, "build_prompt", spy_build)
        monkeypatch.setattr(tito.LineageBook, "commit", spy_commit)


def compare(calls: list[dict], tok) -> dict[str, Any]:
    """Run the recipe's method over the captured calls; agreement counts (calls, prompt ids, routes)."""
    ref = RecipeTokens(tok)
    out = {"calls": 0, "calls_agree": 0, "ids": 0, "ids_agree": 0, "routes_agree": 0, "disagree": []}
    for k, call in enumerate(calls):
        ids, route, base = ref.prompt(call["chat"], call["tools"])
        ours = call["prompt_ids"]
        same = 0
        while same < min(len(ids), len(ours)) and ids[same] == ours[same]:
            same += 1
        ours_route = call["build"] if call["build"] in ("append", "branch") else "create"
        out["calls"] += 1
        out["ids"] += len(ids)
        out["ids_agree"] += same if ids != ours else len(ids)
        out["calls_agree"] += ids == ours
        out["routes_agree"] += route == ours_route
        if ids != ours or route != ours_route:
            out["disagree"].append({"call": k, "at": same, "routes": [route, ours_route]})
        ref.record(call["chat"], call["tools"], call["answer"], ids, call["output_ids"], route, base)
    return out


def edited(turns: list[dict], at: int) -> list[dict]:
    """The session with the first message edited from request `at` on: that request starts a new lineage,
    the whole history (earlier answers and their reasoning included) rendered again."""
    out = copy.deepcopy(turns)
    for t in out[at:]:
        first = t["request"]["messages"][0]
        content = first["content"]
        if isinstance(content, str):
            first["content"] = content + " (edited)"
        else:
            first["content"] = [*content, {"type": "text", "text": "(edited)"}]
    return out


VARIANTS = {
    "recorded": lambda turns: turns,
    "reminder": lambda turns: replay.with_user_note(
        turns, 1, "<system-reminder>Keep going.</system-reminder>"
    ),
    "compacted": lambda turns: replay.compacted(turns, 2),
    "edited": lambda turns: edited(turns, 2),
}


def replay_against_recipe(path: Path, variant: str, tok, monkeypatch) -> dict[str, Any]:
    cap = Capture(monkeypatch)
    turns = VARIANTS[variant](load(path))
    replay.replay_session(turns, tok, mode="tito", family="qwen3_5", reasoning=REASONING)
    return compare(cap.calls, tok)


# ---------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def qwen():
    return qwen_tokenizer()


def test_the_derived_template_is_the_stock_one_with_the_recipes_three_changes(qwen):
    fixed = qwen35_template.derive(STOCK)
    chat = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "fix it"},
        {
            "role": "assistant",
            "content": "Looking.",
            "reasoning_content": REASONING,
            "tool_calls": [
                {"type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}
            ],
        },
        {"role": "tool", "content": "a.py", "tool_call_id": "t1"},
        {"role": "user", "content": "<system-reminder>Keep going.</system-reminder>"},
    ]
    tools = [{"type": "function", "function": {"name": "Bash", "description": "run", "parameters": {}}}]
    stock = qwen.apply_chat_template(chat, tools=tools, tokenize=False, add_generation_prompt=True)
    ours = qwen.apply_chat_template(chat, tools=tools, chat_template=fixed, tokenize=False, add_generation_prompt=True)  # fmt: skip
    assert ours == recipe_render(chat, tools, True)
    # the stock rendering has the second example parameter and the reminder, and drops the reasoning
    assert "example_parameter_2" in stock and "<IMPORTANT>" in stock and REASONING not in stock
    assert "example_parameter_2" not in ours and "<IMPORTANT>" not in ours and REASONING in ours
    # a changed upstream template fails loudly, naming the edit
    for anchor, edit in [
        ("<parameter=example_parameter_2>", "second parameter"),
        ("<IMPORTANT>", "reminder"),
        ("loop.index0 > ns.last_query_index", "reasoning"),
    ]:
        with pytest.raises(qwen35_template.TemplateError, match=edit):
            qwen35_template.derive(STOCK.replace(anchor, "<changed>"))


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("path", sessions(), ids=lambda p: p.name.split(".json")[0])
def test_a_recorded_session_gets_the_recipes_token_ids(path, variant, qwen, monkeypatch):
    got = replay_against_recipe(path, variant, qwen, monkeypatch)
    assert got["calls"] >= 3 and not got["disagree"], got
    assert got["calls_agree"] == got["calls"] and got["ids_agree"] == got["ids"] > 0


class Scripted:
    """An engine answering each call with the next (text, cut by the length limit?) of a script."""

    def __init__(self, tok, script: list[tuple[str, bool]]) -> None:
        self.tok, self.script = tok, list(script)
        self.stop = tok.convert_tokens_to_ids("<|im_end|>")
        self.prompts: list[list[int]] = []

    def generate(self, prompt_ids, sampling):
        self.prompts.append(list(prompt_ids))
        text, cut = self.script.pop(0)
        ids = list(self.tok.encode(text, add_special_tokens=False)) + ([] if cut else [self.stop])
        return GenerateResult(ids, [-0.5] * len(ids), "length" if cut else "stop")


TOOL = {"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}  # fmt: skip
CALL = "<tool_call>\n<function=Bash>\n<parameter=command>\n{}\n</parameter>\n</function>\n</tool_call>"


def _body(messages):
    return {"model": "m", "max_tokens": 64, "system": "sys", "messages": messages, "tools": [TOOL]}


def _then(history: list[dict], answer: dict, result: str, note: str | None = None) -> list[dict]:
    """`history` + the answer echoed + the results of its tool calls (or a user text) + an optional note."""
    uses = [b for b in answer["content"] if b["type"] == "tool_use"]
    content = [{"type": "tool_result", "tool_use_id": u["id"], "content": result} for u in uses]
    content = content or [{"type": "text", "text": result}]
    if note:
        content.append({"type": "text", "text": note})
    return [
        *history,
        {"role": "assistant", "content": answer["content"]},
        {"role": "user", "content": content},
    ]


def test_a_cut_output_and_a_branch_from_an_earlier_call_are_built_as_the_recipe_builds_them(
    qwen, monkeypatch
):
    cap = Capture(monkeypatch)
    script = [
        (f"{REASONING}\n</think>\n\n{CALL.format('ls')}", False),
        (f"{REASONING}\n</think>\n\nI will keep reading the whole", True),  # cut by the length limit
        (f"{REASONING}\n</think>\n\n{CALL.format('cat a.py')}", False),
        (f"{REASONING}\n</think>\n\n{CALL.format('pytest')}", False),
        (f"{REASONING}\n</think>\n\nDone.", False),
        (f"{REASONING}\n</think>\n\nDone too.", False),
    ]
    engine = Scripted(qwen, script)
    with ProxyServer(engine, qwen, ProxyConfig(token_build_model="qwen3_5")) as proxy:
        proxy.create_session("s")
        m0 = [{"role": "user", "content": "fix it"}]
        a0, _, _ = proxy.handle_messages("s", _body(m0))
        m1 = _then(m0, a0, "a.py")
        a1, _, _ = proxy.handle_messages("s", _body(m1))  # answered with a cut output
        m2 = _then(m1, a1, "Continue.")
        a2, _, _ = proxy.handle_messages("s", _body(m2))
        m3 = _then(m2, a2, "def f(): ...")
        proxy.handle_messages("s", _body(m3))
        # the agent goes back to call 2's answer with another result: a branch on call 2's exact ids
        m4 = _then(m2, a2, "No such file.", note="<system-reminder>Keep going.</system-reminder>")
        a4, _, _ = proxy.handle_messages("s", _body(m4))
        proxy.handle_messages("s", _body(_then(m4, a4, "Thanks.")))  # extends the branch
        traj = proxy.read_trajectory("s")
    builds = [t["token_build"] for t in traj["turns"]]
    assert builds == ["first", "append", "append", "append", "branch", "append"]
    assert [s["lineage_reason"] for s in traj["samples"]] == ["first", "branch"]
    got = compare(cap.calls, qwen)
    assert not got["disagree"] and got["calls_agree"] == got["calls"] == 6, got
    # after the cut output the next messages follow directly: no <|im_end|>, no newline
    p1, o1, p2 = engine.prompts[1], traj["turns"][1]["output_ids"], engine.prompts[2]
    assert p2[: len(p1) + len(o1)] == p1 + o1 and o1[-1] != engine.stop
    assert qwen.decode(p2[len(p1) + len(o1) :]).startswith("<|im_start|>user\n")
    # the branch is call 2's exact prompt + output, the newline, then only the new messages
    p2, o2, p4 = engine.prompts[2], traj["turns"][2]["output_ids"], engine.prompts[4]
    assert p4[: len(p2) + len(o2)] == p2 + o2
    assert qwen.decode(p4[len(p2) + len(o2) :]).startswith(
        "\n<|im_start|>user\n<tool_response>\nNo such file."
    )


def test_a_rerendered_lineage_keeps_every_turns_reasoning_and_the_recipes_system_prompt(qwen, monkeypatch):
    prompts: list[list[int]] = []
    orig = replay.ReplayEngine.generate

    def spy(self, prompt_ids, sampling):
        prompts.append(list(prompt_ids))
        return orig(self, prompt_ids, sampling)

    monkeypatch.setattr(replay.ReplayEngine, "generate", spy)
    out = replay.replay_session(edited(load(sessions()[0]), 2), qwen, mode="tito", family="qwen3_5", reasoning=REASONING)  # fmt: skip
    assert out["lineage_reasons"] == ["first", "history_rewrite"]
    first, rerendered = qwen.decode(prompts[0]), qwen.decode(prompts[2])
    assert "<parameter=example_parameter_1>" in first and "example_parameter_2" not in first
    assert "<IMPORTANT>" not in first and first.endswith("<|im_start|>assistant\n<think>\n")
    # the new lineage's prompt is rendered whole, the reasoning of both earlier answers kept
    assert "(edited)" in rerendered and rerendered.count(REASONING) == 2
