"""sweflow's verl agent loop: one GRPO sample = one dispatcher rollout (Claude Code in a sandbox -> proxy -> vLLM).

verl (0.9.1, v1 trainer) instantiates `SweflowAgentLoop` per sample and awaits `run(sampling_params, **row)`;
the loop runs `Dispatcher.run_sample` in a thread. The row format, the worker's runtime, the rollout log and
the outputs are described above the code they concern.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import math
import os
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

from ..errors import ConfigError
from ..proxy.engines import EngineError, EngineTimeout, GenerateResult, SamplingParams
from ..rollout.types import RolloutConfig, RolloutResult
from ..util import is_secret_key, jsonl_line

log = logging.getLogger("sweflow.train.verl")
ROLLOUT_SPEC_ENV = "SWEFLOW_ROLLOUT_SPEC"
ROLLOUT_LOG_ENV = "SWEFLOW_ROLLOUT_LOG"
# Aborted samples of this process, by failure_reason.
ABORTED: Counter[str] = Counter()
_SPEC_KEYS = {"provider", "sandbox", "proxy", "rollout", "sampling"}
# The spec may set these RolloutConfig fields (integrity rules: the defaults; router: the proxy; network: sandbox).
_ROLLOUT_KEYS = {f.name for f in fields(RolloutConfig)} - {"integrity_rules", "router_url", "eval_network"}
_SAMPLING_KEYS = {"max_new_tokens", "max_context_tokens", "temperature", "top_p", "top_k", "engine_timeout_s"}
_SAMPLING_KEYS |= {"max_prompt_tokens", "max_workers", "tokenizer_copies", "chat_template_kwargs"}


# --------------------------------------------------------------------------- the engine


# The proxy's engine is a `ServerManagerEngine`, which schedules `server_manager.generate(request_id=<proxy
# session>, ...)` on the agent loop's event loop, so every turn of a session goes to the same vLLM server.
class ServerManagerEngine:
    """`sweflow.proxy.engines.Engine` over verl's LLMServerClient, callable from the proxy's threads.

    Each call runs `server_manager.generate(request_id=sampling.request_id, ...)` on `loop` (the agent
    loop's event loop) and waits for it; the request id is the proxy session, which verl's load balancer
    keeps on one server. Sampling comes from the verl parameters bound to the session's prefix (`bind`)
    when there are any (validation is greedy), else from the proxy's; max_tokens and stop ids always from
    the proxy. The weight versions each session saw are kept for `versions()`.
    """

    def __init__(
        self, server_manager: Any, loop: asyncio.AbstractEventLoop, *, timeout: float = 3600.0
    ) -> None:
        self.server_manager = server_manager
        self.loop = loop
        self.timeout = timeout
        self._bound: dict[str, dict[str, Any]] = {}
        self._versions: dict[str, tuple[int | None, int | None]] = {}
        self._lock = threading.Lock()

    def bind(self, sampling_params: Mapping[str, Any] | None) -> str:
        """A fresh session prefix (`v<hex>.`) whose calls use these verl sampling params."""
        prefix = f"v{uuid.uuid4().hex[:12]}."
        with self._lock:
            self._bound[prefix[:-1]] = dict(sampling_params or {})
        return prefix

    def release(self, prefix: str) -> None:
        with self._lock:
            self._bound.pop(prefix.rstrip("."), None)

    def versions(self, session_id: str) -> tuple[int | None, int | None]:
        """(min, max) weight version (verl's global_steps) the session's turns were generated with."""
        with self._lock:
            return self._versions.pop(session_id, (None, None))

    def _params(self, sampling: SamplingParams) -> dict[str, Any]:
        key = (sampling.request_id or "").split(".", 1)[0]
        with self._lock:
            bound = self._bound.get(key)
        params: dict[str, Any] = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "repetition_penalty": 1.0,
        }
        params.update({k: v for k, v in (bound or {}).items() if k in params})
        params["logprobs"] = True  # TIS needs the rollout logprob of every sampled token
        params["max_tokens"] = int(sampling.max_tokens)
        if sampling.stop_token_ids:
            params["stop_token_ids"] = list(sampling.stop_token_ids)
        if sampling.seed is not None:
            params["seed"] = sampling.seed
        return params

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise EngineError(
                "ServerManagerEngine.generate was called on its own event loop (it would deadlock)"
            )
        request_id = sampling.request_id or uuid.uuid4().hex
        params = self._params(sampling)
        coro = self.server_manager.generate(
            request_id=request_id, prompt_ids=list(prompt_ids), sampling_params=params
        )
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            out = future.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise EngineTimeout(f"verl server manager did not answer within {self.timeout:g} s") from exc
        except Exception as exc:  # noqa: BLE001 - any server failure is an engine error for the proxy
            raise EngineError(f"verl server manager failed: {type(exc).__name__}: {exc}") from exc
        ids = [int(i) for i in out.token_ids]
        if getattr(out, "stop_reason", None) in ("aborted", "abort"):
            raise EngineError("verl aborted the generation (weights are being updated)")
        if out.log_probs is None or len(out.log_probs) != len(ids):
            raise EngineError(
                f"verl returned {len(ids)} ids but no matching logprobs (calculate_log_probs off?)"
            )
        self._note_versions(request_id, dict(getattr(out, "extra_fields", None) or {}))
        stops = set(sampling.stop_token_ids)
        # verl reports "completed" for both; the stop token (vLLM keeps it in token_ids) tells them apart.
        finish = (
            "stop" if ids and ids[-1] in stops else ("length" if len(ids) >= sampling.max_tokens else "stop")
        )
        return GenerateResult(
            output_ids=ids, logprobs=[float(x) for x in out.log_probs], finish_reason=finish
        )

    def _note_versions(self, request_id: str, extra: dict[str, Any]) -> None:
        lo = extra.get("min_global_steps", extra.get("global_steps"))
        hi = extra.get("max_global_steps", extra.get("global_steps"))
        with self._lock:
            old_lo, old_hi = self._versions.get(request_id, (None, None))
            lo_v = [int(v) for v in (old_lo, lo) if v is not None]
            hi_v = [int(v) for v in (old_hi, hi) if v is not None]
            self._versions[request_id] = (min(lo_v) if lo_v else None, max(hi_v) if hi_v else None)


# --------------------------------------------------------------------------- the rollout spec


# One worker process (a Ray actor) holds one proxy and one provider, built lazily from the JSON rollout spec
# at $SWEFLOW_ROLLOUT_SPEC (`load_rollout_spec`); secrets (E2B_API_KEY, ...) come from the environment, never
# from the spec.
def load_rollout_spec(path: str | os.PathLike) -> dict[str, Any]:
    """The rollout spec JSON: {"provider", "sandbox", "proxy": {host, port, public_url}, "rollout":
    {RolloutConfig fields}, "sampling": {ProxyConfig sampling fields}}; ConfigError on a bad one.

    With `proxy.public_url` set, sandboxes reach every worker's proxy through the run's one gateway
    (`proxy_gateway`). A key that looks like a secret is refused: secrets belong in the environment.
    """
    try:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the rollout spec: {exc}", file=str(path)) from None
    if not isinstance(spec, dict) or not isinstance(spec.get("provider"), str):
        raise ConfigError("the rollout spec needs a provider name", file=str(path), field="provider")
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise ConfigError(f"unknown rollout spec keys {sorted(unknown)}", file=str(path))
    for section, allowed in (("rollout", _ROLLOUT_KEYS), ("sampling", _SAMPLING_KEYS)):
        bad = set(spec.get(section) or {}) - allowed
        if bad:
            raise ConfigError(f"unknown {section} settings {sorted(bad)}", file=str(path), field=section)

    def walk(obj: Any, where: str) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                if is_secret_key(str(k)) and v not in (None, "", {}):
                    raise ConfigError(
                        "a secret in the rollout spec (use the environment)",
                        file=str(path),
                        field=f"{where}{k}",
                    )
                walk(v, f"{where}{k}.")

    walk(spec, "")
    return spec


@dataclass
class Runtime:
    """What one worker process shares between its samples: the engine and a way to run one sample."""

    engine: ServerManagerEngine
    run_sample: Callable[[dict[str, Any], int, str], RolloutResult]  # (row, group index, session prefix)
    executor: concurrent.futures.ThreadPoolExecutor
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for fn in self.closers:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - best effort at shutdown
                log.debug("closing the rollout runtime: %s", exc)
        self.executor.shutdown(wait=False, cancel_futures=True)


def build_runtime(agent_loop: SweflowAgentLoop) -> Runtime:
    """The real runtime from $SWEFLOW_ROLLOUT_SPEC: a ProxyServer over a ServerManagerEngine, the provider,
    and a Dispatcher per sample (sharing both) whose session ids start with the sample's bound prefix."""
    from ..proxy.server import ProxyConfig
    from ..rollout.clients import HttpProxyClient
    from ..rollout.dispatcher import Dispatcher
    from ..sandbox.registry import provider_from_config
    from ..sandbox.settings import SandboxSettings
    from .proxy_gateway import start_worker_proxy
    from .proxy_settings import ProxySettings

    path = os.environ.get(ROLLOUT_SPEC_ENV)
    if not path:
        raise ConfigError(f"${ROLLOUT_SPEC_ENV} is not set: the verl agent loop needs a rollout spec")
    spec = load_rollout_spec(path)
    rollout = dict(spec.get("rollout") or {})
    settings = ProxySettings.from_spec(spec.get("proxy") or {}, where=f"{path}: proxy")
    engine = ServerManagerEngine(agent_loop.server_manager, agent_loop.loop)
    rc = agent_loop.rollout_config
    sampling = {
        "max_new_tokens": int(rc.response_length),
        "max_context_tokens": context_length(rc),
        "temperature": float(rc.temperature),
        "top_p": float(rc.top_p),
        "top_k": max(int(rc.top_k), 0),
        **dict(spec.get("sampling") or {}),
    }
    config = ProxyConfig(
        **sampling, token_build_mode=settings.build_mode, token_build_model=settings.build_model
    )
    proxy, local, router_url = start_worker_proxy(engine, agent_loop.tokenizer, config, settings)
    client = HttpProxyClient(local, admin_token=proxy.admin_token)
    sandbox = SandboxSettings.from_spec(spec.get("sandbox") or {}, where=f"{path}: sandbox")
    provider = provider_from_config(spec["provider"], sandbox)
    base = RolloutConfig.from_spec(rollout, network=sandbox.network, router_url=router_url)

    def run_sample(row: dict[str, Any], group_index: int, prefix: str) -> RolloutResult:
        cfg = replace(base, session_prefix=prefix + base.session_prefix)
        return Dispatcher(provider, client, config=cfg).run_sample(row, group_index)

    workers = max(int(base.max_concurrency), 1)
    executor = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="sweflow-rollout")
    return Runtime(engine=engine, run_sample=run_sample, executor=executor, closers=[proxy.stop])


# Tests replace this to run samples without sandboxes; called once per process with the first agent loop.
RUNTIME_FACTORY: Callable[[Any], Runtime] = build_runtime
_runtime: Runtime | None = None
_runtime_lock = threading.Lock()
_log_lock = threading.Lock()


def process_runtime(agent_loop: SweflowAgentLoop) -> Runtime:
    """This process's runtime, built on first use."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = RUNTIME_FACTORY(agent_loop)
        return _runtime


def reset_runtime() -> None:
    """Close and forget this process's runtime (tests; a worker keeps its runtime for its lifetime)."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.close()
        _runtime = None


# --------------------------------------------------------------------------- outputs


def _plain(value: Any) -> Any:
    """numpy scalars / 0-d arrays (how verl hands non-tensor columns over) -> Python values."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0:
        return item()
    return value


def _finite(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) else 0.0


def context_length(rollout_config: Any) -> int:
    """The context window of a rollout config: max_model_len, else prompt + response slots."""
    declared = getattr(rollout_config, "max_model_len", None)
    slots = int(rollout_config.prompt_length) + int(rollout_config.response_length)
    return int(declared) if declared else slots


# Outputs: one AgentLoopOutput per linearised proxy sample (a compacted or forked session gives several; verl
# computes GRPO from the session's final output and gives the earlier ones its advantage), with the response
# (and its mask and logprobs) cut so the sample holds at most the context window (rollout.max_model_len, i.e.
# train.max_context_tokens) and rollout.response_length. Aborted samples return an EMPTY list: verl's v1
# worker then stores nothing for that session, so the sample is neither trained on nor scored 0 and its group
# is normalised over the samples that finished (a group of one keeps its raw reward: verl's mean-0/std-1
# convention). They are counted by reason in `ABORTED` and the rollout log.
def sample_outputs(
    result: RolloutResult,
    *,
    response_length: int,
    prompt_length: int,
    context: int | None = None,
    versions: tuple[int | None, int | None] = (None, None),
    fallback_version: int = 0,
    extra: Mapping[str, Any] | None = None,
) -> tuple[list[AgentLoopOutput], str | None]:
    """verl outputs for a finished sample, and why it is dropped instead (None: it is trained on).

    Aborted -> no outputs (reason: its failure_reason). Each proxy sample: prompt = its first prompt, the
    rest is the response (masked-out tool-output tokens carry logprob 0.0), cut to `response_length` and so
    the whole sample holds at most `context` tokens. A sample whose prompt exceeds `prompt_length` is left
    out (cutting it would change the context).
    """
    if result.aborted:
        return [], str(result.failure_reason or "aborted")
    lo, hi = versions
    lo = fallback_version if lo is None else lo
    hi = lo if hi is None else hi
    reward = _finite(result.reward)
    outputs: list[AgentLoopOutput] = []
    samples = list(result.samples)
    for index, s in enumerate(samples):
        ids, mask, lps = list(s["token_ids"]), list(s["loss_mask"]), list(s["rollout_logprobs"])
        pl = int(s["prompt_length"])
        if pl > prompt_length:
            log.warning("sample %s: prompt of %d tokens > %d, left out", result.session_id, pl, prompt_length)
            continue
        room = response_length if context is None else max(0, min(response_length, int(context) - pl))
        rmask = [int(m) for m in mask[pl:]][:room]
        rlps = [_finite(lp) if m else 0.0 for lp, m in zip(lps[pl:], mask[pl:], strict=True)][:room]
        outputs.append(
            AgentLoopOutput(
                prompt_ids=ids[:pl],
                response_ids=ids[pl:][:room],
                response_mask=rmask,
                response_logprobs=rlps,
                reward_score=reward,
                num_turns=int(s.get("num_turns") or 0),
                metrics={
                    "generate_sequences": _finite(result.timings.get("agent")),
                    "compute_score": _finite(result.timings.get("evaluate")),
                },
                extra_fields={
                    "turn_scores": [],
                    "tool_rewards": [],
                    "min_global_steps": int(lo),
                    "max_global_steps": int(hi),
                    "reward_extra_info": {"resolved": 1.0 if result.resolved else 0.0},
                    "sweflow": {
                        "instance_id": result.instance_id,
                        "group_index": result.group_index,
                        "failure_reason": result.failure_reason,
                        "aborted": False,
                        "sample": index,
                        "samples": len(samples),
                        "truncated": len(ids) - pl > room,
                        **dict(extra or {}),
                    },
                },
            )
        )
    if not outputs:
        return [], "prompt_too_long"
    return outputs, None


# Each finished sample appends one JSON line (instance, group, reward, failure reason, turns, token counts; no
# patch, no tokens) to `<$SWEFLOW_ROLLOUT_LOG>/<host>-<pid>.jsonl`.
def rollout_log_record(
    result: RolloutResult, *, step: int | None, group: str | None, dropped: str | None
) -> dict[str, Any]:
    """One rollout log line: no patch text, no tokens, no secrets."""
    samples = list(result.samples)
    return {
        "step": step,
        "instance": result.instance_id,
        "group": group,
        "group_index": result.group_index,
        "session_id": result.session_id,
        "status": result.status,
        "aborted": dropped is not None,
        "failure_reason": dropped if dropped is not None else result.failure_reason,
        "reward": _finite(result.reward),
        "resolved": bool(result.resolved),
        "turns": int(result.num_turns),
        "samples": len(samples),
        "prompt_tokens": sum(int(s.get("prompt_length") or 0) for s in samples),
        "response_tokens": sum(sum(int(m) for m in s.get("loss_mask") or []) for s in samples),
        "timings": {k: round(_finite(v), 3) for k, v in sorted(result.timings.items())},
    }


def append_rollout_log(record: Mapping[str, Any], folder: str | os.PathLike | None = None) -> Path | None:
    """Append one line to `<folder or $SWEFLOW_ROLLOUT_LOG>/<host>-<pid>.jsonl` (None when neither is set)."""
    folder = folder or os.environ.get(ROLLOUT_LOG_ENV)
    if not folder:
        return None
    path = Path(folder) / f"{socket.gethostname()}-{os.getpid()}.jsonl"
    with _log_lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(jsonl_line(dict(record)))
    return path


# --------------------------------------------------------------------------- the agent loop


# verl (0.9.1, v1 trainer) instantiates `SweflowAgentLoop` per sample with hydra.utils.instantiate
# (trainer_config=, server_manager=, tokenizer=, processor=, hf_model_type=, dataset_cls=, data_config=,
# tools=) and awaits `run(sampling_params, **row)`. The loop runs `Dispatcher.run_sample` in a thread.
#
# The training parquet (one row per task; verl's RLHFDataset reads it, every column reaches `run` as a keyword
# argument and is stored with each trajectory):
# - `prompt`: [{"role": "user", "content": <the task prompt>}] (verl's prompt_key; the agent renders its own)
# - `data_source`: "sweflow"
# - `agent_name`: "sweflow_claude_code" (optional: the default agent loop is this one)
# - `sweflow_row`: the training row (sweflow.dataset.convert's JSON object) as a JSON string
# - `extra_info`: {"index": <row number>, "instance_id": <id>} (verl groups traces by index)
#
# verl adds `uid` (the prompt's GRPO group), `session_id` (0..n-1: the sample's group index) and
# `global_steps` (the training step).
class SweflowAgentLoop(AgentLoopBase):
    """One training sample through sweflow's dispatcher; see the comment above for the row format."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.response_length = int(self.rollout_config.response_length)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.context_length = context_length(self.rollout_config)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        raw = _plain(kwargs.get("sweflow_row"))
        try:
            row = json.loads(raw) if isinstance(raw, str | bytes) else dict(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"the parquet row's sweflow_row is not a JSON object: {exc}", field="sweflow_row"
            ) from None
        group_index = int(_plain(kwargs.get("session_id")) or 0)
        step_value = _plain(kwargs.get("global_steps"))
        step = int(step_value) if step_value is not None else None
        group = _plain(kwargs.get("uid"))
        runtime = process_runtime(self)
        prefix = runtime.engine.bind(sampling_params)
        try:
            result: RolloutResult = await self.loop.run_in_executor(
                runtime.executor, runtime.run_sample, row, group_index, prefix
            )
        finally:
            runtime.engine.release(prefix)
        versions = runtime.engine.versions(result.session_id)
        outputs, dropped = sample_outputs(
            result,
            response_length=self.response_length,
            prompt_length=self.prompt_length,
            context=self.context_length,
            versions=versions,
            # sync training: step k samples with the weights of step k - 1
            fallback_version=max((step or 1) - 1, 0),
            extra={"group": str(group) if group is not None else None},
        )
        if dropped is not None:
            ABORTED[dropped] += 1
            log.warning(
                "sample %s dropped (%s); aborted so far: %s", result.session_id, dropped, dict(ABORTED)
            )
        append_rollout_log(
            rollout_log_record(result, step=step, group=str(group) if group else None, dropped=dropped)
        )
        return outputs
