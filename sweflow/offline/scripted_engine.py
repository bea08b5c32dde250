"""The scripted engine: a stand-in for a model behind the proxy that replays given assistant texts.

Tokenised by the real tokenizer, the stop token appended, a deterministic logprob per token
(`scripted_logprob`), so the proxy, the recorder and the end-to-end check run without a model.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from sweflow.proxy.engines import EngineError, GenerateResult, SamplingParams


def scripted_logprob(token_id: int, position: int) -> float:
    """The deterministic logprob ScriptedEngine reports: in [-1.0, -0.01], from id and position."""
    return -((token_id * 31 + position * 7) % 100 + 1) / 100.0


class ScriptedEngine:
    """Replays assistant turn texts in order: tokenised, the stop token appended, logprobs by rule.

    `turns` is a list of texts (one per generate call; ProxyError once exhausted unless `cycle`) or a
    callable prompt_ids -> text. `max_tokens` truncates (finish "length"). `delay_s` simulates latency;
    `fail_with` raises that exception on every call (for error-path tests).
    """

    def __init__(
        self,
        turns: Sequence[str] | Callable[[list[int]], str],
        tokenizer: Any,
        *,
        stop_token_id: int | None = None,
        cycle: bool = False,
        delay_s: float = 0.0,
        fail_with: Exception | None = None,
    ) -> None:
        self._turns = turns if callable(turns) else list(turns)
        self.tokenizer = tokenizer
        self.stop_token_id = stop_token_id
        self.cycle = cycle
        self.delay_s = delay_s
        self.fail_with = fail_with
        self.calls = 0
        self._lock = threading.Lock()

    def next_text(self, prompt_ids: list[int]) -> str:
        if callable(self._turns):
            return self._turns(prompt_ids)
        with self._lock:
            index = self.calls
            self.calls += 1
        if index >= len(self._turns) and not (self.cycle and self._turns):
            raise EngineError(f"scripted engine has {len(self._turns)} turns; call {index + 1} has none")
        return self._turns[index % len(self._turns)]

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        if self.delay_s:
            threading.Event().wait(self.delay_s)
        if self.fail_with is not None:
            raise self.fail_with
        text = self.next_text(prompt_ids)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        stop = self.stop_token_id
        if stop is None and sampling.stop_token_ids:
            stop = sampling.stop_token_ids[0]
        if stop is not None:
            ids.append(stop)
        finish = "stop"
        if len(ids) > sampling.max_tokens:
            ids, finish = ids[: sampling.max_tokens], "length"
        lps = [scripted_logprob(t, i) for i, t in enumerate(ids)]
        return GenerateResult(output_ids=ids, logprobs=lps, finish_reason=finish)
