"""The fresh-sandbox evaluation as the dispatcher sees it: extract the agent's patch, grade it elsewhere.

`Evaluator` is the Protocol; `FreshEvaluator` delegates to `sweflow.grading` (`evaluate.extract_patch`,
`agent_eval.evaluate_agent_patch`: infrastructure failures retried, a patch that defeats its own evaluation
graded 0). Unit tests pass their own evaluator; everything else should use FreshEvaluator.
"""

from __future__ import annotations

from typing import Any, Protocol

from sweflow.sandbox.base import Provider, Sandbox
from sweflow.sandbox.settings import NetworkSettings


class Evaluator(Protocol):
    """Patch extraction in the agent's sandbox and evaluation of that patch in a fresh one.

    `extract_patch` returns an object with `patch`, `failure_reason` (None, "empty_generation",
    "prohibited_test_modification", ...) and `test_files`; `evaluate_patch` returns one with `reward`,
    `resolved`, `failure_reason`, `marker` (the reward-marker payload or None), `timings`, `error`.
    """

    def extract_patch(self, sb: Sandbox, base_commit: str) -> Any: ...

    def evaluate_patch(
        self, provider: Provider, template: str, metadata: dict[str, Any], patch: str
    ) -> Any: ...


class FreshEvaluator:
    """The real evaluation (sweflow.grading.evaluate); `options` go to evaluate_patch unchanged. `network` is the
    ``sandbox.network`` settings: each row's fresh sandbox gets ``eval_network(network, repo)``."""

    def __init__(self, *, network: NetworkSettings | None = None, **options: Any) -> None:
        self.network = network
        self.options = options

    def extract_patch(self, sb: Sandbox, base_commit: str) -> Any:
        from sweflow.grading.evaluate import extract_patch

        rules = self.options.get("rules")
        return extract_patch(sb, base_commit, **({"rules": rules} if rules is not None else {}))

    def evaluate_patch(self, provider: Provider, template: str, metadata: dict[str, Any], patch: str) -> Any:
        from sweflow.grading.agent_eval import evaluate_agent_patch
        from sweflow.grading.evaluate import eval_network

        net = eval_network(self.network, str(metadata.get("repo") or ""))
        return evaluate_agent_patch(provider, template, metadata, patch, network=net, **self.options)
