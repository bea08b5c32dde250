"""Token-in/token-out: each call's prompt is the previous call's exact ids plus the appended messages only.

A session holds *lineages* (`LineageBook`): a request extending one of its answered calls gets that call's
ids plus the appended messages' tokens alone, a rendered-suffix diff (`SuffixRenderer`; from an earlier call
of a lineage: a branch); anything else starts a new lineage, rendered whole. Cost does not grow with length.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from sweflow.proxy import qwen35_template as q35
from sweflow.util import common_prefix_length

log = logging.getLogger("sweflow.proxy")

# Re-rendering the whole conversation on every call replaces the model's own output tokens with a
# re-tokenisation of what the agent sent back, and with some templates (Qwen3.5 drops an earlier turn's
# `<think>` block once a user message follows, booleans re-render as Python text) a call's prompt no longer
# extends the previous one, so a session falls apart into many samples.

FAMILIES = ("auto", "qwen3_5", "generic")
MODES = ("tito", "render")
APPEND_ROLES = ("tool", "user", "system")  # what may follow the answered assistant message inside a lineage
DUMMY_QUERY = "."


class SuffixError(Exception):
    """The appended messages cannot be tokenised as a suffix (the reason names why)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def trl_template(name: str) -> str:
    """A chat template TRL ships (`trl/chat_templates/<name>.jinja`), read without importing TRL."""
    text = q35.trl_stock_template(name)
    if text is None:
        raise RuntimeError(f"TRL's chat template {name}.jinja is not installed (pip install trl)")
    return text


def detect_family(tokenizer: Any) -> str:
    """``qwen3_5`` when the tokenizer's own template is a Qwen3.5-family one, else ``generic``."""
    return "qwen3_5" if q35.looks_like_qwen35(getattr(tokenizer, "chat_template", None)) else "generic"


# That needs a template that does not re-render earlier messages when some are appended; per model family:
#
# - ``qwen3_5``: the recipe's fixed Qwen3.5 template (`sweflow.proxy.qwen35_template`: the stock one without
#   the second example parameter and the reminder block, reasoning kept in every assistant turn), the recipe's
#   `TOKEN_BUILD_MODEL=qwen3_5`. It also renders every prompt that starts a lineage, and an output cut by
#   the length limit is followed by the next messages directly (nothing appended), as the recipe does;
# - ``generic``: the tokenizer's own template, checked on each diff (a template that is not prefix-preserving
#   for the dummy makes the call start a new lineage, counted as ``suffix_not_prefix``).
#
# ``auto`` picks ``qwen3_5`` when the tokenizer's template is Qwen3.5's. One that looks like Qwen3.5's but
# cannot be turned into the recipe's falls back to ``generic`` with a warning (sessions may then split); an
# explicit ``qwen3_5`` raises instead.
def suffix_template(family: str, tokenizer: Any) -> str | None:
    """The template appended messages are rendered with (None: the tokenizer's own)."""
    if family == "auto":
        if detect_family(tokenizer) != "qwen3_5":
            return None
        try:
            return q35.recipe_template(tokenizer)
        except q35.TemplateError as exc:
            log.warning(
                "token_build_model auto: the tokenizer's chat template looks like Qwen3.5's, but the recipe's "
                "template cannot be built from it, so prompts are built with the tokenizer's own template "
                "(generic; sessions may split into more samples): %s",
                exc,
            )
            return None
    if family == "qwen3_5":
        return q35.recipe_template(tokenizer)
    if family == "generic":
        return None
    raise ValueError(f"token_build_model must be one of {', '.join(FAMILIES)}, not {family!r}")


# The appended messages are tokenised as a rendered-suffix diff: render a fixed dummy prefix (a user message
# and an assistant message whose tool calls carry the appended results' ids), render it again with the
# appended messages and the generation prompt, tokenize only the difference.
class SuffixRenderer:
    """Appended chat messages -> the text the template adds for them after an answered assistant turn."""

    def __init__(self, tokenizer: Any, template: str | None, chat_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.template = template
        # The recipe's Qwen3.5 template also renders the prompts that start a lineage (`full_template`), and
        # after an output cut by the length limit the recipe appends nothing (`bridge`).
        self.recipe = q35.is_recipe_template(template)
        self.kwargs = dict(chat_kwargs or {})
        self._lock = threading.Lock()  # apply_chat_template compiles and caches; keep renders serial
        self._bridge_cache: dict[str | None, str] = {}

    def _render(self, messages: list[dict], generation: bool) -> str:
        extra = {"chat_template": self.template} if self.template is not None else {}
        with self._lock:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation, **extra, **self.kwargs
            )

    @staticmethod
    def _dummy(appended: list[dict]) -> list[dict]:
        calls = [
            {
                "id": m.get("tool_call_id") or f"call_{i}",
                "type": "function",
                "function": {"name": m.get("name") or "tool", "arguments": {}},
            }
            for i, m in enumerate(appended)
            if m.get("role") == "tool"
        ]
        assistant: dict[str, Any] = {"role": "assistant", "content": "" if calls else DUMMY_QUERY}
        if calls:
            assistant["tool_calls"] = calls
        return [{"role": "user", "content": DUMMY_QUERY}, assistant]

    def suffix(self, appended: list[dict]) -> str:
        """The rendered text of `appended` plus the generation prompt, as it follows an assistant turn."""
        dummy = self._dummy(appended)
        try:
            head = self._render(dummy, False)
            full = self._render(dummy + appended, True)
        except Exception as exc:  # noqa: BLE001 - jinja raise_exception and friends
            raise SuffixError("suffix_render_failed", str(exc)) from None
        if not full.startswith(head):
            raise SuffixError("suffix_not_prefix", "the template re-renders earlier messages")
        return full[len(head) :]

    @property
    def full_template(self) -> str | None:
        """The template a whole conversation is rendered with when it starts a lineage (None: the
        tokenizer's own)."""
        return self.template if self.recipe else None

    def bridge(self, stop_texts: list[str], ended_with: str | None) -> str:
        """What the template writes after an assistant turn's content that the model did not produce: the
        rest of the closer after the stop token the output ended with (Qwen: `<|im_end|>` then `\\n`), or
        the whole closer when the output was cut by the length limit (`ended_with` None; with the recipe's
        template nothing: the next messages follow the cut output directly). Empty when the template
        closes a turn with none of `stop_texts`."""
        if ended_with is None and self.recipe:
            return ""
        key = ended_with
        if key not in self._bridge_cache:
            head = self._render(self._dummy([]), False)
            out = ""
            for stop in [ended_with] if ended_with is not None else stop_texts:
                at = head.rfind(stop) if stop else -1
                if at >= 0 and not head[at + len(stop) :].strip():
                    tail = head[at + len(stop) :]
                    out = tail if ended_with is not None else stop + tail
                    break
            self._bridge_cache[key] = out
        return self._bridge_cache[key]


# Here a session holds *lineages*:
#
# - a lineage is a chain of answered calls, each one's prompt extending the one before token for token; each
#   call keeps its exact prompt and output ids and the assistant message it answered, and the lineage keeps
#   the chat messages of its last call's prompt (every earlier call's are a prefix of them);
# - a request that repeats the messages of a call, then the assistant message the proxy answered (as the
#   agent echoes it: its tool calls restored to what the model wrote), then only tool results / user
#   messages, extends that call: prompt = the call's ids + the bridge the template puts after an assistant
#   message's stop token (`<|im_end|>` -> `\n`) + the tokens of the appended messages alone. Extending a
#   lineage's last call continues the lineage ("append"); extending an earlier one starts a new lineage on
#   that call's exact ids ("branch"), as the recipe does; where several calls fit, the one with the longest
#   history wins, then a lineage's last call, then the newest;
# - anything else (the first call, a compaction, an edited earlier message, other system prompt or tools, a
#   sub-agent's own conversation) starts a new lineage, rendered whole (`SuffixRenderer.full_template`).
@dataclass
class Call:
    """One answered call of a lineage."""

    seq: int  # the session's call order (a newer call has a larger one)
    size: int  # how many chat messages its prompt was built from: the first `size` of its lineage's chat
    answer: dict  # the chat form of the assistant message it answered
    # its prompt ids and output ids, kept apart: the prompt list is the one its turn records, so a commit
    # copies no ids and frees none (at 100k tokens a copy or a free costs ~0.2 ms per call)
    prompt_ids: list[int]
    output_ids: list[int]
    ended_with_stop: bool = True  # False: cut by the length limit

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def last_id(self) -> int | None:
        ids = self.output_ids or self.prompt_ids
        return ids[-1] if ids else None

    def extended(self, appended: list[int]) -> list[int]:
        """The call's exact ids followed by `appended`, as one new list (one copy)."""
        out = self.prompt_ids.copy()
        out += self.output_ids
        out += appended
        return out


@dataclass
class Lineage:
    """One exact token history of a session: its calls, each extending the one before."""

    id: int
    reason: str  # why it started: first, branch, history_rewrite, tools_changed, system_changed, ...
    tools: Any  # the chat tools its calls were rendered with (compared, never re-rendered)
    chat: list[dict] = field(default_factory=list)  # the chat messages of its last call's prompt
    calls: list[Call] = field(default_factory=list)
    version: int = 0  # bumped by every commit: a concurrent sibling request forks instead
    previous_chat: list[dict] | None = None  # the chat before the last commit (for `rollback`)


@dataclass
class Plan:
    """How one request's prompt is built: extend call `base` of `lineage` with `appended`, or start anew."""

    lineage: Lineage | None
    appended: list[dict]
    reason: str  # "append", "branch", or why a new lineage starts
    version: int = 0
    base: Call | None = None


def _norm_tools(tools: Any) -> Any:
    return tools or None


def _same_answer(echoed: dict, answer: dict) -> bool:
    """Whether the agent echoed the answered assistant message. Its reasoning is not compared: the
    lineage holds the model's own reasoning tokens, whatever the agent sends back (Claude Code keeps or
    drops thinking blocks by its own rules)."""
    return {k: v for k, v in echoed.items() if k != "reasoning_content"} == {
        k: v for k, v in answer.items() if k != "reasoning_content"
    }


# The cost of a call is the cost of converting its messages to chat form and comparing them with each
# lineage's once (no tokenisation of the history), so it does not grow with the prompt's token count.
class LineageBook:
    """The lineages of one session; thread-safe."""

    def __init__(self) -> None:
        self._lineages: list[Lineage] = []
        self._lock = threading.Lock()
        self._seq = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._lineages)

    def plan(self, chat: list[dict], tools: Any) -> Plan:
        """Find the call `chat` extends (comment above), or say why none does."""
        tools = _norm_tools(tools)
        with self._lock:
            book = [(lin, lin.chat, list(lin.calls), lin.version) for lin in reversed(self._lineages)]
        if not book:
            return Plan(None, [], "first")
        reason = "history_rewrite"
        best: tuple[tuple[int, bool, int], Plan] | None = None
        for lin, lin_chat, calls, version in book:
            if not calls:
                continue
            if chat[0:1] != lin_chat[0:1]:
                reason = "system_changed" if reason == "history_rewrite" else reason
                continue
            same = common_prefix_length(chat, lin_chat)
            # Only the deepest call whose answer the request echoes can fit: for an earlier one, the
            # messages after its answer hold a later answer, which no append may.
            at = next(
                (
                    i
                    for i in range(len(calls) - 1, -1, -1)
                    if calls[i].size <= same
                    and len(chat) > calls[i].size + 1
                    and _same_answer(chat[calls[i].size], calls[i].answer)
                ),
                None,
            )
            if at is None:
                continue
            if lin.tools != tools:
                reason = "tools_changed"
                continue
            call = calls[at]
            appended = chat[call.size + 1 :]
            bad = [m.get("role") for m in appended if m.get("role") not in APPEND_ROLES]
            if bad:
                reason = f"appended_{bad[0]}"
                continue
            last = at == len(calls) - 1
            key = (call.size, last, call.seq)
            if best is None or key > best[0]:
                best = (key, Plan(lin, appended, "append" if last else "branch", version, call))
        return best[1] if best is not None else Plan(None, [], reason)

    def commit(
        self,
        plan: Plan,
        *,
        chat: list[dict],
        tools: Any,
        answer: dict,
        prompt_ids: list[int],
        output_ids: list[int],
        ended_with_stop: bool,
    ) -> tuple[int, str, int]:
        """Record a finished call: extend the planned lineage, or start one; (lineage id, how: "append" or
        why a new lineage started, the lineage's version after the commit, for `rollback`)."""
        tools = _norm_tools(tools)
        with self._lock:
            self._seq += 1
            call = Call(self._seq, len(chat), answer, prompt_ids, output_ids, ended_with_stop)
            lin = plan.lineage
            if lin is not None and plan.reason == "append" and lin.version == plan.version:
                lin.previous_chat, lin.chat = lin.chat, chat
                lin.calls.append(call)
                lin.version += 1
                return lin.id, "append", lin.version
            reason = "concurrent_fork" if lin is not None and plan.reason == "append" else plan.reason
            new = Lineage(len(self._lineages), reason, tools, chat, [call], 1)
            self._lineages.append(new)
            return new.id, reason, new.version

    def rollback(self, lineage_id: int, version: int) -> bool:
        """Undo the commit that left lineage `lineage_id` at `version` (its answer never reached the agent,
        so the agent's retry must extend the lineage as it was). A lineage that commit started can never
        be extended again; a later commit on the lineage makes the undo a no-op (False)."""
        with self._lock:
            lin = self._lineages[lineage_id] if 0 <= lineage_id < len(self._lineages) else None
            if lin is None or lin.version != version or not lin.calls:
                return False
            lin.calls.pop()
            if lin.previous_chat is not None:
                lin.chat = lin.previous_chat
            lin.previous_chat, lin.version = None, lin.version + 1
            return True

    def reasons(self) -> list[str]:
        with self._lock:
            return [lin.reason for lin in self._lineages]
