"""Replay a recorded agent session through the proxy: how a token-building mode folds it into samples.

A recorded session (`tests/fixtures/sessions/*.json.gz`) is played call by call through an in-process
`ProxyServer` whose engine answers with the recorded responses; out come the samples per session, drift
realignments, lineage reasons, exact-extension checks and the proxy's time per call.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

from sweflow.proxy.engines import GenerateResult, SamplingParams
from sweflow.proxy.server import ProxyConfig, ProxyServer
from sweflow.proxy.toolcalls import format_qwen_xml


# A recorded session (`tests/fixtures/sessions/*.json.gz`: every request the agent sent and every response it
# got, as Messages) is played call by call through an in-process `ProxyServer` whose engine answers call k
# with the recorded response k written the way the model family writes it (optional reasoning closed by
# `</think>`, text, Qwen3-coder XML tool calls, the stop token).
class ReplayEngine:
    """Answers each call with the next of a list of output id lists (logprob -0.5 per token)."""

    def __init__(self) -> None:
        self.queue: list[list[int]] = []
        self.prompts: list[list[int]] = []

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        self.prompts.append(list(prompt_ids))
        ids = self.queue.pop(0)
        return GenerateResult(ids, [-0.5] * len(ids), "stop")


def output_text(response: dict, reasoning: str = "", tokenizer: Any = None, stop_text: str = "") -> str:
    """A recorded response as the model writes it: what the tokenizer's chat template puts between the
    generation prompt and the stop token for that assistant message (reasoning, text, tool calls); without
    a template that extends its generation prompt so, reasoning closed by `</think>`, text, Qwen3-coder XML."""
    from sweflow.proxy import anthropic as an

    blocks = [b for b in response.get("content") or [] if isinstance(b, dict)]
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        answer = an.to_chat_messages(None, [{"role": "assistant", "content": blocks}])[0]
        if reasoning:
            answer["reasoning_content"] = reasoning
        query = [{"role": "user", "content": "."}]
        try:
            head = tokenizer.apply_chat_template(query, tokenize=False, add_generation_prompt=True)
            full = tokenizer.apply_chat_template(query + [answer], tokenize=False)
        except Exception:  # noqa: BLE001 - a template that refuses this shape: the plain form below
            head = full = ""
        at = full.rfind(stop_text) if stop_text else -1
        if head and full.startswith(head) and at >= len(head):
            return full[len(head) : at]
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    calls = [format_qwen_xml(b["name"], b.get("input") or {}) for b in blocks if b.get("type") == "tool_use"]
    body = text + ("\n\n" if text and calls else "") + "\n".join(calls)
    return (f"{reasoning}\n</think>\n\n" if reasoning else "") + body


# The agent's side is replayed as recorded, with what it echoes of the proxy's answers replaced by what this
# proxy answered (fresh tool-call ids, the reasoning text), so its own quirks (re-serialised tool inputs,
# mid-list system messages, history edits) stay in.
def _echoed(request: dict, ids: dict[str, str], answers: dict[Any, tuple[str, list[dict]]]) -> dict:
    """The recorded request with the agent's echo of earlier answers replaced by this proxy's answers: each
    assistant message the agent sent for a recorded response (known by its tool-call ids, or by its text
    when it called no tool) gets the thinking block and text this proxy answered; its tool calls stay as the agent wrote them
    (re-serialised inputs and all), with this proxy's ids."""
    out = copy.deepcopy(request)
    for msg in out.get("messages") or []:
        content = msg.get("content")
        if msg.get("role") != "assistant" or not isinstance(content, list):
            continue
        calls = tuple(b.get("id") for b in content if isinstance(b, dict) and b.get("type") == "tool_use")
        key = calls or "".join(
            b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
        if key not in answers:
            continue
        text, thinking = answers[key]
        rest = [
            b
            for b in content
            if not (isinstance(b, dict) and b.get("type") in ("text", "thinking", "redacted_thinking"))
        ]
        msg["content"] = thinking + ([{"type": "text", "text": text}] if text else []) + rest
    raw = json.dumps(out)
    for old, new in ids.items():
        raw = raw.replace(json.dumps(old), json.dumps(new))
    return json.loads(raw)


def replay_session(
    turns: Sequence[dict],
    tokenizer: Any,
    *,
    mode: str,
    family: str = "auto",
    reasoning: str = "",
    session_id: str = "replay",
) -> dict[str, Any]:
    """Play `turns` (each with `request` and `response`) through a proxy in `mode` ("tito" | "render")."""
    engine = ReplayEngine()
    config = ProxyConfig(token_build_mode=mode, token_build_model=family, max_prompt_tokens=1 << 22)
    proxy = ProxyServer(engine, tokenizer, config).start()  # calls go in-process; stop() needs it serving
    try:
        proxy.create_session(session_id)
        stop = proxy.stop_ids[0]
        id_map: dict[str, str] = {}
        answers: dict[Any, tuple[str, list[dict]]] = {}
        call_s: list[float] = []
        for turn in sorted(turns, key=lambda t: t["index"]):
            if turn.get("aborted"):
                continue
            req = _echoed(turn["request"], id_map, answers)
            body = {**req, "max_tokens": 16000, "stream": False}
            text = output_text(turn["response"], reasoning, tokenizer, tokenizer.decode([stop]))
            engine.queue.append(list(tokenizer.encode(text, add_special_tokens=False)) + [stop])
            t0 = time.perf_counter()
            message, _rec, _index = proxy.handle_messages(session_id, body)
            call_s.append(time.perf_counter() - t0)
            recorded = [b for b in turn["response"].get("content") or [] if isinstance(b, dict)]
            got = [b for b in message["content"] if isinstance(b, dict)]
            old_ids = [b["id"] for b in recorded if b.get("type") == "tool_use"]
            new_ids = [b["id"] for b in got if b.get("type") == "tool_use"]
            id_map.update(zip(old_ids, new_ids, strict=False))
            old_text = "".join(b.get("text", "") for b in recorded if b.get("type") == "text")
            answers[tuple(old_ids) or old_text] = (
                "".join(b.get("text", "") for b in got if b.get("type") == "text"),
                [b for b in got if b.get("type") == "thinking"],  # echoed back, as Claude Code does
            )
        traj = proxy.read_trajectory(session_id)
    finally:
        proxy.stop()
    return session_figures(traj, call_s)


def with_user_note(turns: list[dict], at: int, note: str) -> list[dict]:
    """The session with a user text block after the tool results of request `at` (and of every later
    request, which repeats it): what Claude Code sends with a system reminder or a queued user message."""
    out = copy.deepcopy(turns)
    n = len(out[at]["request"]["messages"])
    for t in out[at:]:
        msg = t["request"]["messages"][n - 1]
        assert msg["role"] == "user"
        msg["content"] = [*msg["content"], {"type": "text", "text": note}]
    return out


def compacted(turns: list[dict], at: int) -> list[dict]:
    """The session with request `at` onwards rewritten as a compaction would: the history up to then
    replaced by one user message holding a summary."""
    out = copy.deepcopy(turns)
    n = len(out[at]["request"]["messages"])
    summary = {
        "role": "user",
        "content": [{"type": "text", "text": "Summary of the work so far: parser read."}],
    }
    for t in out[at:]:
        t["request"]["messages"] = [summary, *t["request"]["messages"][n - 1 :]]
    # a tool_result must follow its call: compaction keeps only the summary and what came after
    for t in out[at:]:
        first = t["request"]["messages"][1]
        first["content"] = [b for b in first["content"] if b.get("type") != "tool_result"] or [
            {"type": "text", "text": "Continue."}
        ]
    return out


def exact_extension(turns: Sequence[dict]) -> bool:
    """Whether every turn of each lineage starts with the previous turn's exact prompt + output."""
    last: dict[Any, list[int]] = {}
    for t in sorted(turns, key=lambda t: t["index"]):
        if t.get("aborted") or t.get("lineage") is None:
            continue
        prev = last.get(t["lineage"])
        if prev is not None and t["prompt_ids"][: len(prev)] != prev:
            return False
        last[t["lineage"]] = list(t["prompt_ids"]) + list(t["output_ids"])
    return True


# What comes out: samples per session, drift realignments, why each lineage started, whether every call of a
# lineage starts with the previous call's exact prompt + output, and the proxy's time per call.
def session_figures(traj: dict[str, Any], call_s: Sequence[float] = ()) -> dict[str, Any]:
    """The figures of one replayed (or live) session's trajectory."""
    samples, turns = traj["samples"], traj["turns"]
    model_tokens = sum(len(t["output_ids"]) for t in turns if not t.get("aborted"))
    kept = sum(sum(s["loss_mask"]) for s in samples)
    return {
        "turns": len(turns),
        "samples": len(samples),
        "drift_realignments": sum(int(s.get("drift_realignments", 0)) for s in samples),
        "lineage_reasons": [s.get("lineage_reason") for s in samples],
        "exact_extension": exact_extension(turns),
        "model_tokens": model_tokens,
        "model_tokens_in_samples": kept,
        "tokens_in_samples": sum(len(s["token_ids"]) for s in samples),
        "call_ms_p50": round(statistics.median(call_s) * 1000, 3) if call_s else None,
    }
