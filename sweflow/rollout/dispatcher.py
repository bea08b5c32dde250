"""One rollout sample end to end, and groups of them under a concurrency limit.

`Dispatcher.run_sample`: sandbox -> agent -> patch -> fresh-sandbox evaluation -> integrity scan -> reward
-> RolloutResult (every step is listed above `_Rollout._run`). Any exception aborts the sample and kills
every sandbox it created; a fresh evaluation whose infrastructure failed aborts it too: never reward 0.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from sweflow.errors import SweflowError
from sweflow.grading.integrity import apply_integrity, scan_tool_calls, tool_calls_from_turns
from sweflow.grading.reasons import INFRA_REASONS, PATCH_EXTRACTION_FAILED, PATCH_UNEXTRACTABLE
from sweflow.grading.reward import RewardResult, price_tampering
from sweflow.progress import item_log
from sweflow.rollout.clients import BlackboxClient, HttpStatusError, ProxyClient
from sweflow.rollout.evaluator import Evaluator, FreshEvaluator
from sweflow.rollout.types import (
    ABORTED,
    COMPLETED,
    SANDBOX_DIED,
    STEP_REASONS,
    RolloutConfig,
    RolloutResult,
    patch_stats,
)
from sweflow.sandbox.base import BLACKBOX_PORT, Provider, Sandbox
from sweflow.schema import default

log = logging.getLogger("sweflow.rollout")
# Steps that use the agent's sandbox: a failure there while the sandbox is gone is "sandbox_died".
_SANDBOX_STEPS = ("health", "register", "before_agent", "agent", "patch")


class Abort(Exception):
    """Stop this sample with `reason` (its failure_reason) and a one-line `detail`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


class TrackingProvider:
    """Wraps a provider and remembers every sandbox it created, so a sample can kill all of them."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.name = inner.name
        self.created: list[Sandbox] = []
        self._lock = threading.Lock()

    def create(self, template: str, **kw: Any) -> Sandbox:
        sb = self.inner.create(template, **kw)
        with self._lock:
            self.created.append(sb)
        return sb

    def __getattr__(self, name: str) -> Any:  # anything else a caller needs from the real provider
        return getattr(self.inner, name)

    def kill_all(self) -> None:
        with self._lock:
            boxes = list(self.created)
        for sb in boxes:
            try:
                sb.kill()
            except Exception as exc:  # noqa: BLE001 - one failed kill must not keep the others alive
                log.warning("killing sandbox %s failed: %s", getattr(sb, "id", "?"), exc)


def prompt_of(row: dict[str, Any]) -> str:
    """The agent's first message: the row's user prompt contents joined (a string prompt as is)."""
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return prompt
    parts = [m.get("content", "") for m in prompt or [] if isinstance(m, dict) and m.get("role") == "user"]
    text = "\n\n".join(p for p in parts if isinstance(p, str))
    if not text.strip():
        raise Abort("bad_row", "the row has no user prompt")
    return text


def new_session_id(prefix: str, instance_id: str, group_index: int) -> str:
    """`<prefix><instance>:<group index>:<8 hex>` within the 128 characters proxy and blackbox accept."""
    tail = f":{group_index}:{uuid.uuid4().hex[:8]}"
    head = f"{prefix}{instance_id}"[: 128 - len(tail)]
    return head + tail


def loopback_egress(url: str) -> str | None:
    """ "127.0.0.1:<port>" when `url` is a loopback http(s) URL (the proxy on this machine), else None."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not host:
        return None
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    return f"127.0.0.1:{port}" if loopback else None


def _one_line(exc: BaseException) -> str:
    text = exc.one_line() if isinstance(exc, SweflowError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:500]


class Dispatcher:
    """Runs rollout samples against one provider and one proxy; at most `config.max_concurrency` at once.

    Thread-safe: `run_sample` may be called from many threads; `run_group` / `run_groups` do it for you.
    """

    def __init__(
        self,
        provider: Provider,
        proxy: ProxyClient,
        *,
        evaluator: Evaluator | None = None,
        config: RolloutConfig | None = None,
    ) -> None:
        self.provider = provider
        self.proxy = proxy
        self.config = config or RolloutConfig()
        # The patch check of the fresh evaluation uses the same integrity rules as the tool-call scan.
        self.evaluator = evaluator or FreshEvaluator(
            rules=self.config.integrity_rules, network=self.config.eval_network
        )
        if self.config.max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        self._slots = threading.BoundedSemaphore(self.config.max_concurrency)

    def run_sample(self, row: dict[str, Any], group_index: int) -> RolloutResult:
        """Run one sample; never raises for a failure of the sample itself (it is an aborted result)."""
        with self._slots:
            return _Rollout(self, row, group_index).run()

    def run_group(self, row: dict[str, Any], n: int) -> list[RolloutResult]:
        """`n` samples of one row concurrently (under the dispatcher's limit), ordered by group index."""
        return self.run_groups([row], n)[0]

    def run_groups(self, rows: Sequence[dict[str, Any]], n: int) -> list[list[RolloutResult]]:
        """`n` samples of every row, all under one concurrency limit; results[i][g] is row i, index g."""
        jobs = [(i, g) for i in range(len(rows)) for g in range(n)]
        if not jobs:
            return [[] for _ in rows]
        out: list[list[RolloutResult | None]] = [[None] * n for _ in rows]
        workers = min(len(jobs), self.config.max_concurrency)
        progress = item_log(len(jobs), "rollouts", log)
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="rollout") as pool:
            futures = {pool.submit(self.run_sample, rows[i], g): (i, g) for i, g in jobs}
            for fut in concurrent.futures.as_completed(futures):
                i, g = futures[fut]
                res = out[i][g] = fut.result()
                progress.update(item=f"{res.instance_id} g{g}", ok=res.status != ABORTED,
                                note=f"{res.status} reward={res.reward}")  # fmt: skip
        return [[r for r in group if r is not None] for group in out]


class _Rollout:
    """The state of one sample while it runs (one instance per run_sample call)."""

    def __init__(self, d: Dispatcher, row: dict[str, Any], group_index: int) -> None:
        self.d, self.cfg, self.row, self.group_index = d, d.config, row, group_index
        self.meta: dict[str, Any] = dict(row.get("metadata") or {})
        self.instance_id = str(self.meta.get("instance_id") or "unknown")
        self.session_id = new_session_id(self.cfg.session_prefix, self.instance_id, group_index)
        self.boxes = TrackingProvider(d.provider)
        self.sb: Sandbox | None = None
        self.bb: BlackboxClient | None = None
        self.step = "start"
        self.timings: dict[str, float] = {}
        self.proxy_session = False
        self.session_token: str | None = None
        self.agent_running = False
        self.evaluation: dict[str, Any] = {}
        self.evaluation_log = ""

    # ------------------------------------------------------------------ helpers
    def _timed(self, step: str) -> _StepTimer:
        self.step = step
        return _StepTimer(self.timings, step)

    def _sandbox_alive(self) -> bool:
        if self.sb is None or getattr(self.sb, "killed", False):
            return False
        try:
            return self.sb.run("true", timeout=20).exit_code == 0
        except Exception:  # noqa: BLE001 - any fault here means the sandbox is not usable
            return False

    def _result(self, status: str, reason: str | None, **kw: Any) -> RolloutResult:
        return RolloutResult(
            instance_id=self.instance_id,
            group_index=self.group_index,
            session_id=self.session_id,
            status=status,
            failure_reason=reason,
            timings={k: round(v, 3) for k, v in self.timings.items()},
            **kw,
        )

    # ------------------------------------------------------------------ the flow
    # Any exception aborts the sample (status "aborted", failure_reason naming the failed step, or
    # "sandbox_died" when the agent's sandbox is gone) and every sandbox it created is killed. A fresh
    # evaluation whose infrastructure failed (``EvalResult.infra``: provider fault, dead sandbox, ...) aborts
    # the sample with failure_reason "evaluation_error" (its evaluation and log kept): never reward 0.
    def run(self) -> RolloutResult:
        t0 = time.monotonic()
        try:
            result = self._run()
        except Abort as exc:
            result = self._abort(exc.reason, exc.detail)
        except Exception as exc:  # noqa: BLE001 - any failure aborts only this sample
            reason = STEP_REASONS.get(self.step, f"{self.step}_failed")
            if self.step in _SANDBOX_STEPS and self.sb is not None and not self._sandbox_alive():
                reason = SANDBOX_DIED
            result = self._abort(reason, f"{self.step}: {_one_line(exc)}")
        finally:
            self._cleanup()
        result.timings = {**result.timings, "total": round(time.monotonic() - t0, 3)}
        log.info(
            "sample %s g%d: %s reward=%s reason=%s",
            self.instance_id,
            self.group_index,
            result.status,
            result.reward,
            result.failure_reason,
        )
        return result

    def _abort(self, reason: str, detail: str) -> RolloutResult:
        log.warning("sample %s g%d aborted: %s (%s)", self.instance_id, self.group_index, reason, detail)
        return self._result(
            ABORTED, reason, error=detail, evaluation=self.evaluation, evaluation_log=self.evaluation_log
        )

    def _cleanup(self) -> None:
        if self.agent_running and self.bb is not None:
            try:
                self.bb.abort(self.session_id)
            except Exception:  # noqa: BLE001 - the sandbox is killed next anyway
                pass
        self.boxes.kill_all()
        if not self.proxy_session:
            return
        ops = [self.d.proxy.finalize_session] + (
            [self.d.proxy.delete_session] if self.cfg.delete_sessions else []
        )
        for op in ops:
            try:
                op(self.session_id)
            except Exception as exc:  # noqa: BLE001 - best effort: the result is already decided
                log.debug("proxy cleanup of %s: %s", self.session_id, exc)

    # For a training row (see sweflow.dataset.convert) and a group index, `Dispatcher.run_sample`: sandbox
    # from the row's template (its only egress: the proxy, when the proxy listens on loopback) -> blackbox
    # /health -> proxy session (its token) -> register the agent (router = the proxy as the sandbox sees it,
    # bearer = the session's token, the row's backend options; every blackbox call carries the sandbox's
    # blackbox token) -> before-agent commands (a required one that fails aborts the sample) -> the prompt as
    # one agent turn -> the patch (git diff against the base commit) -> the agent sandbox is killed ->
    # fresh-sandbox evaluation -> finalise and read the proxy trajectory -> integrity scan of the tool calls
    # the proxy recorded -> reward -> RolloutResult.
    #
    # The after-agent commands of the row are not run in the agent sandbox: the fresh evaluation replaces
    # them.
    def _run(self) -> RolloutResult:
        meta = self.meta
        template = meta.get("sandbox_image")
        base_commit = meta.get("base_commit")
        if not template or not base_commit:
            raise Abort("bad_row", "metadata needs sandbox_image and base_commit")
        prompt = prompt_of(self.row)
        backend = dict(meta.get("backend_options") or {})
        sandbox_timeout = float(self.cfg.sandbox_timeout or meta.get("sandbox_timeout_sec") or 3600)
        turn_timeout = float(self.cfg.turn_timeout or backend.get("turn_timeout") or sandbox_timeout)

        # The proxy is the one endpoint the agent may reach; a public proxy URL (E2B) needs no egress.
        egress = loopback_egress(self.d.proxy.url)
        with self._timed("sandbox"):
            self.sb = self.boxes.create(
                template,
                timeout=sandbox_timeout,
                metadata={"instance_id": self.instance_id, "session_id": self.session_id},
                **({"egress": egress} if egress else {}),
            )
        with self._timed("health"):
            self.bb = BlackboxClient(
                self.sb.port_url(BLACKBOX_PORT), token=getattr(self.sb, "blackbox_token", None)
            )
            self.bb.wait_healthy(self.cfg.health_timeout)
        with self._timed("proxy_session"):
            self.session_token = self.d.proxy.create_session(
                self.session_id, {"instance_id": self.instance_id, "group_index": self.group_index}
            )
            self.proxy_session = True
        router_url = getattr(self.sb, "egress_url", None) or self.cfg.router_url or self.d.proxy.url
        with self._timed("register"):
            self.bb.register(
                {
                    "agent_type": meta.get("blackbox_type") or default("agent.blackbox_type"),
                    "session_id": self.session_id,
                    "instance_id": self.instance_id,
                    "router_url": router_url,
                    "router_token": self.session_token,
                    "backend_options": backend,
                }
            )
        with self._timed("before_agent"):
            self._before_agent()
        with self._timed("agent"):
            agent = self._agent_turn(prompt, turn_timeout)
        with self._timed("patch"):
            patch = self.d.evaluator.extract_patch(self.sb, base_commit)
        failure = getattr(patch, "failure_reason", None)
        if failure in (PATCH_EXTRACTION_FAILED, PATCH_UNEXTRACTABLE):
            # The provider failing (extraction_failed) says nothing about the agent: dropped. git failing in
            # a live sandbox (unextractable) is the agent's doing, since nothing else touches that tree:
            # graded 0 below, or breaking its own repository would buy a sample out of training.
            alive = self._sandbox_alive()
            if not alive or failure == PATCH_EXTRACTION_FAILED:
                reason = PATCH_EXTRACTION_FAILED if alive else SANDBOX_DIED
                raise Abort(reason, str(getattr(patch, "error", "") or "git diff failed")[:500])
        self.boxes.kill_all()  # the agent sandbox is done; the evaluation gets a fresh one
        patch_text = getattr(patch, "patch", "") or ""
        patch_info = {
            **patch_stats(patch_text),
            "failure_reason": getattr(patch, "failure_reason", None),
            "test_files": list(getattr(patch, "test_files", None) or []),
        }
        if self.cfg.evaluate:
            with self._timed("evaluate"):
                base, evaluation = self._evaluate(template, patch_text, patch_info["failure_reason"])
        else:
            failure = patch_info["failure_reason"]
            base = RewardResult(0.0, False, failure, {})
            evaluation = {"deferred": True, "failure_reason": failure}
        with self._timed("trajectory"):
            self.d.proxy.finalize_session(self.session_id)
            trajectory = self.d.proxy.read_trajectory(self.session_id)
        samples = list(trajectory.get("samples") or [])
        turns = list(trajectory.get("turns") or [])
        num_turns = len(turns)
        if not samples and not any(t.get("response") for t in turns):
            raise Abort("no_trajectory", "the proxy recorded no model turn for this session")
        with self._timed("integrity"):
            # The calls the proxy saw the model make, not the sandbox's account of them (the agent can
            # replace its own blackbox server and tell any story).
            calls = tool_calls_from_turns(trajectory.get("turns") or [])
            violations = scan_tool_calls(calls, str(meta.get("repo") or ""), rules=self.cfg.integrity_rules)
            final = apply_integrity(price_tampering(base, self.cfg.tampered_reward), violations)
        return self._result(
            COMPLETED,
            final.failure_reason,
            reward=final.reward,
            resolved=final.resolved,
            samples=samples,
            num_turns=num_turns,
            patch=patch_info,
            evaluation=evaluation,
            evaluation_log=self.evaluation_log,
            integrity_violations=[v.to_dict() for v in violations],
            agent={**agent, "tool_calls": len(calls)},
            **({} if self.cfg.evaluate else {"patch_text": patch_text, "turns": turns}),
            **({"patch_text": patch_text} if self.cfg.evaluate and self.cfg.keep_patch else {}),
        )

    def _before_agent(self) -> None:
        cmds = (self.meta.get("blackbox_execute_cmds") or {}).get("before_agent") or []
        for i, spec in enumerate(cmds):
            name = str(spec.get("name") or f"before_agent_{i}")
            answer = self.bb.execute_cmd(
                self.session_id, str(spec["cmd"]), timeout=float(spec.get("timeout") or 120)
            )
            ok = answer.get("returncode") == 0 and not answer.get("timed_out")
            if not ok and spec.get("required", False):
                tail = (answer.get("stderr") or answer.get("stdout") or "").strip()[-300:]
                raise Abort(
                    f"before_agent_failed:{name}",
                    f"exit {answer.get('returncode')}{' (timed out)' if answer.get('timed_out') else ''}: {tail}",
                )
            if not ok:
                log.warning(
                    "optional before-agent command %s failed (exit %s)", name, answer.get("returncode")
                )

    def _agent_turn(self, prompt: str, timeout: float) -> dict[str, Any]:
        self.agent_running = True
        try:
            answer = self.bb.send_message(self.session_id, prompt, timeout=timeout)
        except HttpStatusError as exc:
            if not self._sandbox_alive():
                raise Abort(SANDBOX_DIED, f"agent turn: {exc.problem}") from exc
            raise Abort(f"agent_{exc.error_type or 'error'}", exc.problem) from exc
        finally:
            self.agent_running = False
        if answer.get("api_error"):
            # The agent could not get a model answer: the proxy failed, not the policy.
            errors = "; ".join(str(e) for e in answer.get("errors") or [])[:300]
            raise Abort(f"proxy_error:{answer['api_error']}", errors or str(answer.get("result", ""))[:300])
        return {
            k: answer.get(k)
            for k in ("num_turns", "is_error", "subtype", "stop_reason", "terminal_reason", "duration")
        }

    def _evaluate(
        self, template: str, patch: str, patch_failure: str | None
    ) -> tuple[RewardResult, dict[str, Any]]:
        if patch_failure:
            # Nothing worth grading (no change, or a change to the tests): reward 0 without a sandbox.
            return RewardResult(0.0, False, patch_failure, {}), {
                "skipped": True,
                "failure_reason": patch_failure,
            }
        ev = self.d.evaluator.evaluate_patch(self.boxes, template, self.meta, patch)
        evaluation = {
            "reward": float(getattr(ev, "reward", 0.0)),
            "resolved": bool(getattr(ev, "resolved", False)),
            "failure_reason": getattr(ev, "failure_reason", None),
            "marker": getattr(ev, "marker", None),
            "timings": dict(getattr(ev, "timings", None) or {}),
            "error": getattr(ev, "error", None),
            "exit_code": getattr(ev, "exit_code", None),
            "statuses": dict(getattr(ev, "statuses", None) or {}),
        }
        self.evaluation, self.evaluation_log = evaluation, str(getattr(ev, "log", "") or "")
        if evaluation["error"] or evaluation["failure_reason"] in INFRA_REASONS:
            # The evaluation did not happen: nothing is known about the patch, so no reward at all.
            raise Abort(
                STEP_REASONS["evaluate"],
                f"fresh evaluation ({evaluation['failure_reason']}): {evaluation['error']}"[:500],
            )
        base = RewardResult(
            evaluation["reward"],
            evaluation["resolved"],
            evaluation["failure_reason"],
            dict(evaluation["marker"] or {}),
        )
        return base, evaluation


class _StepTimer:
    def __init__(self, timings: dict[str, float], step: str) -> None:
        self.timings, self.step = timings, step

    def __enter__(self) -> None:
        self.t0 = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.timings[self.step] = time.monotonic() - self.t0
