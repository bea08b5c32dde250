"""Generation engines behind the proxy: token ids in, token ids + per-token logprobs out.

Every engine returns the logprob of each sampled token under the model's raw distribution (no
temperature/top-p applied), which is what vLLM reports by default and what importance-sampling
corrections in training compare against. Output ids include the stop token when generation stopped on one.
"""

from __future__ import annotations

import inspect
import json
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Protocol

from sweflow.errors import ProxyError
from sweflow.schema import default


class EngineError(ProxyError):
    """The engine failed to generate (HTTP 502 from the proxy)."""


class EngineTimeout(EngineError):
    """The engine did not answer in time (HTTP 504 from the proxy)."""


@dataclass
class SamplingParams:
    """Per-call sampling settings; temperature 0 means greedy."""

    max_tokens: int = 1024
    temperature: float = default("train.sampling.temperature")
    top_p: float = default("train.sampling.top_p")
    top_k: int = default("train.sampling.top_k")
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    # The proxy session the call belongs to: engines that route per session (verl's sticky server
    # manager) use it as their request id; the others ignore it.
    request_id: str | None = None


@dataclass
class GenerateResult:
    """Sampled ids, one logprob per id, and "stop" (a stop token was produced) or "length"."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str

    def __post_init__(self) -> None:
        if len(self.output_ids) != len(self.logprobs):
            raise EngineError(f"engine returned {len(self.output_ids)} ids but {len(self.logprobs)} logprobs")


def turn_seed(base: int, request_id: str | None, prompt_len: int) -> int | None:
    """A sampling seed from the run's seed, the session (less the random tail the dispatcher adds to its
    id) and the turn (the prompt's length): the same run samples the same tokens."""
    import hashlib

    if request_id is None:
        return None
    session = request_id.rsplit(":", 1)[0]
    digest = hashlib.sha256(f"{base}|{session}|{prompt_len}".encode()).hexdigest()
    return int(digest[:15], 16)


class Engine(Protocol):
    """Anything that continues a prompt given as token ids. Must be safe to call from many threads."""

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult: ...


# --------------------------------------------------------------------------- vLLM


def _token_id(token: Any) -> int:
    """vLLM with return_tokens_as_token_ids spells tokens as 'token_id:123'."""
    if isinstance(token, int):
        return token
    if isinstance(token, str) and token.startswith("token_id:"):
        return int(token.split(":", 1)[1])
    raise EngineError(f"vLLM returned token {token!r}, not 'token_id:N' (is return_tokens_as_token_ids on?)")


class VLLMEngine:
    """vLLM's OpenAI-compatible server via POST {base_url}/v1/completions with the prompt as token ids.

    Asks for `return_token_ids` (vLLM >= 0.10.2: `choices[0].token_ids`) and also for
    `return_tokens_as_token_ids` + `logprobs: 1` (older servers: ids from `logprobs.tokens`); logprobs
    always come from `logprobs.token_logprobs`. `base_url` may end in /v1 or not.
    """

    def __init__(self, base_url: str, model: str, timeout: float = 600.0, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.timeout = timeout
        self._api_key = api_key

    def _payload(self, prompt_ids: list[int], sampling: SamplingParams) -> dict:
        payload: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt_ids),
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
        }
        if sampling.top_k > 0:
            payload["top_k"] = sampling.top_k
        if sampling.stop_token_ids:
            payload["stop_token_ids"] = list(sampling.stop_token_ids)
        if sampling.seed is not None:
            payload["seed"] = sampling.seed
        return payload

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        data = json.dumps(self._payload(prompt_ids, sampling)).encode()
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        req = urllib.request.Request(
            f"{self.base_url}/v1/completions", data=data, headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace")
            raise EngineError(f"vLLM at {self.base_url} answered HTTP {exc.code}: {detail}") from exc
        except TimeoutError as exc:
            raise EngineTimeout(f"vLLM at {self.base_url} did not answer within {self.timeout:g} s") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise EngineTimeout(
                    f"vLLM at {self.base_url} did not answer within {self.timeout:g} s"
                ) from exc
            raise EngineError(f"vLLM at {self.base_url} unreachable: {exc.reason}") from exc
        except (ValueError, OSError) as exc:
            raise EngineError(f"vLLM at {self.base_url}: bad response ({exc})") from exc
        return self.parse_completion(body)

    @staticmethod
    def parse_completion(body: dict) -> GenerateResult:
        """Read ids, logprobs and finish reason out of a /v1/completions response body."""
        try:
            choice = body["choices"][0]
        except (KeyError, IndexError, TypeError) as exc:
            raise EngineError(f"vLLM response has no choices: {str(body)[:200]}") from exc
        lp = choice.get("logprobs") or {}
        logprobs = lp.get("token_logprobs")
        ids = choice.get("token_ids")
        if ids is None:
            if lp.get("tokens") is None:
                raise EngineError("vLLM response has neither token_ids nor logprobs.tokens")
            ids = [_token_id(t) for t in lp["tokens"]]
        if logprobs is None:
            raise EngineError("vLLM response has no logprobs.token_logprobs (was logprobs requested?)")
        logprobs = [float(x) if x is not None else 0.0 for x in logprobs]
        finish = choice.get("finish_reason") or "stop"
        return GenerateResult(output_ids=[int(i) for i in ids], logprobs=logprobs, finish_reason=finish)


# --------------------------------------------------------------------------- transformers


class TransformersEngine:
    """Local generation with a transformers causal LM (a manual KV-cached sampling loop).

    `model` is a path (loaded with AutoModelForCausalLM.from_pretrained) or a loaded model. Calls are
    serialised by an engine-local lock (the model is not re-entrant); meant for tests, demos and CPU.
    """

    def __init__(self, model: Any, device: str = "cpu", dtype: Any = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        if isinstance(model, str | bytes) or hasattr(model, "__fspath__"):
            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype or torch.float32)
        self._bind(model.to(device).eval(), device)

    def _bind(self, model: Any, device: str) -> None:
        """Generate with `model` (already on `device`) from now on."""
        self.model = model
        self.device = device
        # transformers 5.x renamed the forward argument past_key_values -> cache; accept both.
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._lock = threading.Lock()

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        torch = self._torch
        if not prompt_ids:
            raise EngineError("empty prompt")
        gen = torch.Generator(device="cpu")
        gen.manual_seed(sampling.seed if sampling.seed is not None else torch.seed() % (2**63))
        stops = set(sampling.stop_token_ids)
        out_ids: list[int] = []
        out_lps: list[float] = []
        finish = "length"
        with self._lock, torch.no_grad():
            inputs = torch.tensor([prompt_ids], device=self.device)
            past = None
            for _ in range(sampling.max_tokens):
                res = self.model(input_ids=inputs, use_cache=True, **{self._cache_arg: past})
                past = res.cache if getattr(res, "cache", None) is not None else res.past_key_values
                logits = res.logits[0, -1].float()
                raw_logp = torch.log_softmax(logits, dim=-1)
                token = _sample(torch, logits, sampling, gen)
                out_ids.append(token)
                out_lps.append(float(raw_logp[token]))
                if token in stops:
                    finish = "stop"
                    break
                inputs = torch.tensor([[token]], device=self.device)
        return GenerateResult(output_ids=out_ids, logprobs=out_lps, finish_reason=finish)


def _sample(torch: Any, logits: Any, sampling: SamplingParams, gen: Any) -> int:
    if sampling.temperature <= 0:
        return int(torch.argmax(logits))
    scaled = logits / sampling.temperature
    if sampling.top_k > 0:
        kth = torch.topk(scaled, min(sampling.top_k, scaled.numel())).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < sampling.top_p
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[order[keep]] = True
        probs = torch.where(mask, probs, torch.zeros_like(probs))
        probs = probs / probs.sum()
    return int(torch.multinomial(probs.cpu(), 1, generator=gen))
