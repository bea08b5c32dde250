"""Tokenisation that one huge prompt cannot turn into a proxy-wide stall.

`TokenizerPool` hands out private copies of the tokenizer, so a long encode holds one copy, never a
proxy-wide lock; a prompt over `limit` tokens is refused with bounded work (the three steps are above
`TokenizerPool.encode`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("sweflow.proxy")

CHUNK_CHARS = 32_768
CHUNK_SLACK = 16


class PromptTooLong(Exception):
    """The rendered prompt has more tokens than the configured limit (`count` is a lower bound)."""

    def __init__(self, count: int, limit: int) -> None:
        super().__init__(f"prompt is too long: at least {count} tokens > {limit} maximum")
        self.count, self.limit = count, limit


def max_token_bytes(tokenizer: Any) -> int:
    """An upper bound on the UTF-8 bytes of text one token stands for (the longest vocabulary entry).

    Vocabulary strings are never shorter in UTF-8 than the text they cover (byte-level BPE spells each
    byte as one character of 1-2 bytes; SentencePiece spells a space as the 3-byte '▁')."""
    vocab = tokenizer.get_vocab()
    return max((len(t.encode("utf-8")) for t in vocab), default=1) or 1


def _chunks(text: str, size: int) -> Iterator[str]:
    """Pieces of about `size` characters, cut after a newline that a non-space follows where one is near
    (a cut the usual pre-tokenizers make anyway), else at `size`."""
    start, n = 0, len(text)
    while start < n:
        end = start + size
        if end >= n:
            yield text[start:]
            return
        cut = text.find("\n", end, end + size)
        while cut != -1 and cut + 1 < n and text[cut + 1].isspace():
            cut = text.find("\n", cut + 1, end + size)
        end = cut + 1 if cut != -1 else end
        yield text[start:end]
        start = end


# `TokenizerPool` hands out private copies of the tokenizer (fast tokenizers are not safe to share between
# threads), so a long encode holds one copy, never a proxy-wide lock; transformers' fast encode releases the
# GIL while the Rust code runs.
class TokenizerPool:
    """Up to `size` private copies of a tokenizer, made on demand; `with pool.get() as tok:`."""

    def __init__(self, tokenizer: Any, size: int = 8) -> None:
        if size < 1:
            raise ValueError("tokenizer pool size must be >= 1")
        self._template = tokenizer
        self._size = size
        self._free: list[Any] = []
        self._made = 0
        self._cond = threading.Condition()
        self.max_token_bytes = max_token_bytes(tokenizer)

    @contextlib.contextmanager
    def get(self) -> Iterator[Any]:
        with self._cond:
            while not self._free and self._made >= self._size:
                self._cond.wait()
            if self._free:
                tok = self._free.pop()
            else:
                self._made += 1
                tok = None
        if tok is None:
            try:
                tok = copy.deepcopy(self._template)
            except Exception as exc:  # noqa: BLE001 - an uncopyable tokenizer is shared, as before
                log.warning("cannot copy the tokenizer (%s); sharing one instance", exc)
                tok = self._template
        try:
            yield tok
        finally:
            with self._cond:
                self._free.append(tok)
                self._cond.notify()

    # `encode_limited` refuses a prompt over `limit` tokens with bounded work:
    # 1. a sound lower bound first, without tokenising: each token covers at most `max_token_bytes` bytes of
    #   text, so more than `limit * max_token_bytes` bytes is certainly too long;
    # 2. a text of more than `limit` bytes might be too long: it is counted in chunks of `CHUNK_CHARS`,
    #   stopping as soon as the running count passes the limit (plus `CHUNK_SLACK` tokens per chunk boundary,
    #   what a cut can change), so a 10 MB prompt costs about `limit` tokens of work before it is refused;
    # 3. only then the whole text is encoded (the ids the engine gets) and its exact length checked.
    def encode(self, text: str, limit: int | None = None) -> list[int]:
        """`text` -> token ids (no special tokens added); PromptTooLong past `limit` (comment above)."""
        with self.get() as tok:
            if limit is None:
                return list(tok.encode(text, add_special_tokens=False))
            n_bytes = len(text.encode("utf-8", "surrogatepass"))
            if n_bytes > limit * self.max_token_bytes:
                raise PromptTooLong(-(-n_bytes // self.max_token_bytes), limit)
            if n_bytes > limit:
                total = 0
                for k, chunk in enumerate(_chunks(text, CHUNK_CHARS), start=1):
                    total += len(tok.encode(chunk, add_special_tokens=False))
                    if total > limit + CHUNK_SLACK * k:
                        raise PromptTooLong(total - CHUNK_SLACK * k, limit)
            ids = list(tok.encode(text, add_special_tokens=False))
        if len(ids) > limit:
            raise PromptTooLong(len(ids), limit)
        return ids

    def decode(self, ids: list[int]) -> str:
        with self.get() as tok:
            return tok.decode(ids, skip_special_tokens=False)
