"""The proxy's prompt side: a Messages request -> prompt token ids, and output ids -> text.

`build_prompt` extends an answered call of the session token for token (`sweflow.proxy.tito`), else renders
the whole conversation (`render_chat`: the tokenizer's template, or the recipe's Qwen3.5 one). Mixed into
`ProxyServer`, whose `__init__` sets what it reads (config, tokenizer pool, suffix renderer, stop ids).
"""

from __future__ import annotations

import logging
from typing import Any

from sweflow.proxy import anthropic as an
from sweflow.proxy.handler import HttpError
from sweflow.proxy.recorder import SessionRecord
from sweflow.proxy.tito import Plan, SuffixError, SuffixRenderer
from sweflow.proxy.tokenize import PromptTooLong, TokenizerPool
from sweflow.proxy.toolcalls import THINK_OPEN

log = logging.getLogger("sweflow.proxy")


class PromptBuilding:
    """Prompt rendering and decoding for `ProxyServer` (see the module docstring)."""

    config: Any
    tokenizer: Any
    stop_ids: list[int]
    _tokenizers: TokenizerPool | None
    _suffix: SuffixRenderer | None
    _stop_texts: list[str]
    _midlist_role: str

    def _chat(self, req: an.MessagesRequest, session: SessionRecord | None) -> tuple[list[dict], list]:
        messages = session.restore_tool_inputs(req.messages) if session is not None else req.messages
        chat = an.to_chat_messages(req.system, messages, midlist_system=self._midlist_role)
        return chat, an.to_chat_tools(req.tools)

    def _render_text(self, chat: list[dict], tools: list) -> str:
        kwargs = dict(self.config.chat_template_kwargs)
        full = self._suffix.full_template if self._suffix is not None else None
        if full is not None:  # the recipe's Qwen3.5 template renders the prompts that start a lineage too
            kwargs["chat_template"] = full
        return self.tokenizer.apply_chat_template(
            chat, tools=tools or None, add_generation_prompt=True, tokenize=False, **kwargs
        )

    def render_chat(
        self, req: an.MessagesRequest, session: SessionRecord | None = None
    ) -> tuple[list[int], list[dict], list]:
        """Request -> (prompt ids of the whole conversation, the chat messages, the chat tools), with the
        session's own tool calls restored to what the model wrote. Rendered through the tokenizer's chat
        template, or the recipe's Qwen3.5 one when token building uses it (`SuffixRenderer.full_template`)."""
        chat, tools = self._chat(req, session)
        try:
            text = self._render_text(chat, tools)
        except Exception as exc:  # jinja raise_exception and friends: the conversation is not renderable
            # Some templates (Qwen3.5) refuse a system message after the first; Claude Code sends them.
            if self._midlist_role == "user":
                raise HttpError(
                    400, "invalid_request_error", f"chat template rejected the messages: {exc}"
                ) from exc
            self._midlist_role = "user"
            chat, tools = self._chat(req, session)
            try:
                text = self._render_text(chat, tools)
            except Exception:
                raise HttpError(
                    400, "invalid_request_error", f"chat template rejected the messages: {exc}"
                ) from exc
            log.info("chat template refused mid-list system messages; rendering them as user messages")
        try:
            return self._tokenizers.encode(text, self.config.max_prompt_tokens), chat, tools
        except PromptTooLong as exc:
            raise HttpError(413, "request_too_large", str(exc)) from None

    def render(self, req: an.MessagesRequest, session: SessionRecord | None = None) -> list[int]:
        """Request -> prompt token ids of the whole conversation (see `render_chat`)."""
        return self.render_chat(req, session)[0]

    def build_prompt(
        self, req: an.MessagesRequest, rec: SessionRecord
    ) -> tuple[list[int], Plan | None, list[dict], list]:
        """The prompt ids of one call: token-in/token-out (the exact ids of the call it extends + the bridge
        + the appended messages' suffix) when the request extends an answered call of the session, else the
        whole rendered conversation (a new lineage, `plan.reason` says why). Plan None: token_build_mode
        "render"."""
        if self._suffix is None:
            ids, chat, tools = self.render_chat(req, rec)
            return ids, None, chat, tools
        chat, tools = self._chat(req, rec)
        plan = rec.lineages.plan(chat, tools)
        if plan.base is not None:
            base = plan.base
            room = self.config.max_prompt_tokens - len(base)
            try:
                stop = base.last_id() if base.ended_with_stop else None
                ended = self._stop_texts[self.stop_ids.index(stop)] if stop is not None else None
                text = self._suffix.bridge(self._stop_texts, ended) + self._suffix.suffix(plan.appended)
                if room <= 0:
                    raise PromptTooLong(len(base), self.config.max_prompt_tokens)
                return base.extended(self._tokenizers.encode(text, room)), plan, chat, tools
            except PromptTooLong as exc:
                raise HttpError(413, "request_too_large", str(exc)) from None
            except SuffixError as exc:
                log.info("session %s: %s; the call starts a new lineage", rec.session_id, exc)
                plan = Plan(None, [], exc.reason)
        ids, chat, tools = self.render_chat(req, rec)
        return ids, plan, chat, tools

    def _opens_thinking(self, prompt_ids: list[int]) -> bool:
        """Whether the prompt ends inside an open `<think>` block (Qwen3.5's thinking generation prompt)."""
        return self._tokenizers.decode(prompt_ids[-4:]).rstrip().endswith(THINK_OPEN)

    def decode(self, output_ids: list[int]) -> str:
        ids = list(output_ids)
        while ids and ids[-1] in self.stop_ids:
            ids.pop()
        return self._tokenizers.decode(ids)
