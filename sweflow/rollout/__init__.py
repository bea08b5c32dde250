"""Rollout dispatcher: one training row + group index -> sandbox, agent, fresh evaluation, reward, samples.

A trainer's rollout function runs a `Dispatcher` over a sandbox provider and an `HttpProxyClient` (a typical
use is shown above `__all__`). `sweflow.rollout.e2e` runs one sample task this way with two scripted
policies (the end-to-end check).
"""

from sweflow.rollout.clients import (
    BlackboxClient,
    HttpProxyClient,
    HttpStatusError,
    ProxyClient,
    TransportError,
)
from sweflow.rollout.dispatcher import Dispatcher, TrackingProvider, new_session_id, prompt_of
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

# Typical use (a trainer's rollout function):
#
#     from sweflow.rollout import Dispatcher, HttpProxyClient, RolloutConfig
#     from sweflow.sandbox.registry import get_provider
#
#     d = Dispatcher(get_provider("docker"),
#                    HttpProxyClient(proxy_url, admin_token=proxy_admin_token),
#                    config=RolloutConfig(max_concurrency=16))
#     for result in d.run_group(row, n=8):           # RolloutResult per group index
#         batch.extend(result.training_samples())   # token_ids, loss_mask, rollout_logprobs, reward, ...
__all__ = [
    "ABORTED",
    "COMPLETED",
    "SANDBOX_DIED",
    "STEP_REASONS",
    "BlackboxClient",
    "Dispatcher",
    "Evaluator",
    "FreshEvaluator",
    "HttpProxyClient",
    "HttpStatusError",
    "ProxyClient",
    "RolloutConfig",
    "RolloutResult",
    "TrackingProvider",
    "TransportError",
    "new_session_id",
    "patch_stats",
    "prompt_of",
]
