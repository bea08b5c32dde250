"""Token-in/token-out: each call's prompt is the previous call's exact ids plus the appended messages only.

A session holds *lineages* (`LineageBook`): a request that extends a lineage's last call gets that call's
ids plus the tokens of the appended messages alone, tokenised as a rendered-suffix diff (`SuffixRenderer`);
anything else starts a new lineage. A call's cost does not grow with the prompt's token count.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

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


@lru_cache(maxsize=8)
def trl_template(name: str) -> str:
    """A chat template TRL ships (`trl/chat_templates/<name>.jinja`), read from the installed package."""
    from importlib import resources

    try:
        return (resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise RuntimeError(
            f"token_build_model qwen3_5 needs TRL's chat template {name}.jinja (pip install trl): {exc}"
        ) from exc


def detect_family(tokenizer: Any) -> str:
    """``qwen3_5`` when the tokenizer's template is Qwen3.5's own (as TRL ships it), else ``generic``."""
    own = (getattr(tokenizer, "chat_template", None) or "").strip()
    if not own:
        return "generic"
    for name in ("qwen3_5_think", "qwen3_5_nothink"):
        try:
            if own == trl_template(name).strip():
                return "qwen3_5"
        except RuntimeError:
            return "generic"
    return "generic"


# That needs a template that does not re-render earlier messages when some are appended; per model family:
#
# - ``qwen3_5``: TRL's prefix-preserving Qwen3.5 template (`trl/chat_templates/qwen3_5_think_training.jinja`,
#   thinking kept in every assistant turn), the recipe's `TOKEN_BUILD_MODEL=qwen3_5`;
# - ``generic``: the tokenizer's own template, checked on each diff (a template that is not prefix-preserving
#   for the dummy makes the call start a new lineage, counted as ``suffix_not_prefix``).
def suffix_template(family: str, tokenizer: Any) -> str | None:
    """The template appended messages are rendered with (None: the tokenizer's own)."""
    if family == "auto":
        family = detect_family(tokenizer)
    if family == "qwen3_5":
        own = (getattr(tokenizer, "chat_template", None) or "").strip()
        nothink = own == trl_template("qwen3_5_nothink").strip() if own else False
        return trl_template("qwen3_5_nothink_training" if nothink else "qwen3_5_think_training")
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

    def bridge(self, stop_texts: list[str], ended_with: str | None) -> str:
        """What the template writes after an assistant turn's content that the model did not produce: the
        rest of the closer after the stop token the output ended with (Qwen: `<|im_end|>` then `\\n`), or
        the whole closer when the output was cut by the length limit (`ended_with` None). Empty when the
        template closes a turn with none of `stop_texts`."""
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
# - a lineage is the exact token ids of its last call (prompt + output) and the chat messages that call was
#   built from;
# - a request that repeats a lineage's messages, then the assistant message the proxy answered (as the agent
#   echoes it: its tool calls restored to what the model wrote), then only tool results / user messages,
#   extends it: prompt = lineage ids + the bridge the template puts after an assistant message's stop token
#   (`<|im_end|>` -> `\n`) + the tokens of the appended messages alone;
# - anything else (the first call, a compaction, an edited earlier message, other system prompt or tools, a
#   sub-agent's own conversation) starts a new lineage, rendered whole through the tokenizer's template.
@dataclass
class Lineage:
    """One exact token history of a session."""

    id: int
    reason: str  # why it started: first, history_rewrite, tools_changed, system_changed, ...
    tools: Any  # the chat tools its calls were rendered with (compared, never re-rendered)
    chat: list[dict] = field(default_factory=list)  # the chat messages of its last call's prompt
    answer: dict | None = None  # the chat form of the assistant message the last call answered
    # its last call's prompt ids and output ids, kept apart: the prompt list is the one its turn records, so
    # a commit copies no ids and frees none (at 100k tokens a copy or a free costs ~0.2 ms per call)
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    ended_with_stop: bool = True
    version: int = 0  # bumped by every commit: a concurrent sibling request forks instead
    previous: tuple | None = None  # (chat, answer, prompt ids, output ids, ended_with_stop) before it

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def last_id(self) -> int | None:
        ids = self.output_ids or self.prompt_ids
        return ids[-1] if ids else None

    def extended(self, appended: list[int]) -> list[int]:
        """The lineage's exact ids followed by `appended`, as one new list (one copy)."""
        out = self.prompt_ids.copy()
        out += self.output_ids
        out += appended
        return out


@dataclass
class Plan:
    """How one request's prompt is built: extend `lineage` with `appended`, or start a new one."""

    lineage: Lineage | None
    appended: list[dict]
    reason: str  # "append", or why a new lineage starts
    version: int = 0


def _norm_tools(tools: Any) -> Any:
    return tools or None


def _same_answer(echoed: dict, answer: dict) -> bool:
    """Whether the agent echoed the answered assistant message. Its reasoning is not compared: the
    lineage holds the model's own reasoning tokens, whatever the agent sends back (Claude Code keeps or
    drops thinking blocks by its own rules)."""
    return {k: v for k, v in echoed.items() if k != "reasoning_content"} == {
        k: v for k, v in answer.items() if k != "reasoning_content"
    }


# The cost of a call is the cost of converting its messages to chat form and comparing them with the lineage's
# (no tokenisation of the history), so it does not grow with the prompt's token count.
class LineageBook:
    """The lineages of one session; thread-safe."""

    def __init__(self) -> None:
        self._lineages: list[Lineage] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._lineages)

    def plan(self, chat: list[dict], tools: Any) -> Plan:
        """Find the lineage `chat` extends (newest first), or say why none does."""
        tools = _norm_tools(tools)
        with self._lock:
            lineages = list(reversed(self._lineages))
        if not lineages:
            return Plan(None, [], "first")
        reason = "history_rewrite"
        for lin in lineages:
            if lin.answer is None:
                continue
            n = len(lin.chat)
            if len(chat) <= n + 1:
                continue
            if chat[0:1] != lin.chat[0:1]:
                reason = "system_changed" if reason == "history_rewrite" else reason
                continue
            if chat[:n] != lin.chat or not _same_answer(chat[n], lin.answer):
                continue
            if lin.tools != tools:
                reason = "tools_changed"
                continue
            appended = chat[n + 1 :]
            bad = [m.get("role") for m in appended if m.get("role") not in APPEND_ROLES]
            if bad:
                reason = f"appended_{bad[0]}"
                continue
            return Plan(lin, appended, "append", lin.version)
        return Plan(None, [], reason)

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
            lin = plan.lineage
            if lin is not None and lin.version == plan.version:
                lin.previous = (lin.chat, lin.answer, lin.prompt_ids, lin.output_ids, lin.ended_with_stop)
                lin.chat, lin.answer, lin.prompt_ids, lin.output_ids = chat, answer, prompt_ids, output_ids
                lin.ended_with_stop, lin.version = ended_with_stop, lin.version + 1
                return lin.id, "append", lin.version
            reason = plan.reason if lin is None else "concurrent_fork"
            new = Lineage(
                len(self._lineages), reason, tools, chat, answer, prompt_ids, output_ids, ended_with_stop, 1
            )
            self._lineages.append(new)
            return new.id, reason, new.version

    def rollback(self, lineage_id: int, version: int) -> bool:
        """Undo the commit that left lineage `lineage_id` at `version` (its answer never reached the agent,
        so the agent's retry must extend the lineage as it was). A lineage that commit started can never
        be extended again; a later commit on the lineage makes the undo a no-op (False)."""
        with self._lock:
            lin = self._lineages[lineage_id] if 0 <= lineage_id < len(self._lineages) else None
            if lin is None or lin.version != version:
                return False
            if lin.previous is None:
                lin.answer, lin.prompt_ids, lin.output_ids = None, [], []
            else:
                lin.chat, lin.answer, lin.prompt_ids, lin.output_ids, lin.ended_with_stop = lin.previous
            lin.previous, lin.version = None, lin.version + 1
            return True

    def reasons(self) -> list[str]:
        with self._lock:
            return [lin.reason for lin in self._lineages]
