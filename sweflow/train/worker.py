"""One process of a TRL GRPO run: `trl_in_process` (the rule's own process, or each rank of a data-parallel
run) and `main` (`python -m sweflow.train.worker`, started by torchrun on each node; see sweflow.train.launch).

Reads its spec from $SWEFLOW_TRAIN_SPEC and removes it from the environment first, so no proxy, sandbox or
child process inherits the live config. Logs to <logs>/rank-<RANK>.log.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import SweflowError
from ..util import atomic_write_json, setup_logging
from .launch import SPEC_ENV
from .preempt import EXIT_TIME_LIMIT, TimeLimitStop


# Every rank rolls out its share of each step through its own proxy and sandboxes; torch.distributed (gloo on
# CPU, NCCL on GPUs) averages the gradients; rank 0 writes the metrics, rollout records, checkpoints and
# <result>.
def trl_in_process(
    recipe, rows, model_dir, work, proxy, sandbox, provider, *, tracking=None, tracking_dir=None, attach=None
) -> dict[str, Any]:
    """One TRL process's run: its rollouts (its own proxy and sandboxes) and its share of every step.
    `proxy`: the ProxySettings; `sandbox`: the SandboxSettings; `tracking`, `tracking_dir`, `attach`: see
    `train_trl`."""
    from ..sandbox.registry import provider_from_config
    from .rollouts import PolicyRollouts
    from .trl_engine import train_trl

    prov = provider_from_config(provider, sandbox)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))

    def factory(engine: Any) -> PolicyRollouts:
        return PolicyRollouts(
            engine,
            tokenizer,
            prov,
            max_new_tokens=recipe.max_response_tokens,
            max_context_tokens=recipe.max_context_tokens,
            temperature=recipe.temperature,
            top_p=recipe.top_p,
            top_k=recipe.top_k,
            host=proxy.host,
            port=proxy.port_for_rank(int(os.environ.get("RANK", 0))),
            public_url=proxy.public_url,
            max_concurrency=recipe.max_concurrency,
            turn_timeout=recipe.turn_timeout,
            session_prefix=f"{recipe.run}.",
            tampered_reward=recipe.tampered_reward,
            eval_network=sandbox.network,
            token_build_mode=proxy.build_mode,
            token_build_model=proxy.build_model,
        )

    return train_trl(recipe, rows=rows, model_dir=model_dir, out_dir=work, rollouts_factory=factory,
                     tracking=tracking, tracking_dir=tracking_dir, attach=attach)  # fmt: skip


def main() -> int:
    raw = os.environ.pop(SPEC_ENV, None)
    if raw is None:
        print(
            f"sweflow: {SPEC_ENV} is not set (this module is started by the train_grpo rule)", file=sys.stderr
        )
        return 2
    spec = json.loads(raw)
    rank = int(os.environ.get("RANK", 0))
    log = setup_logging(Path(spec["logs"]) / f"rank-{rank}.log")
    log.info(
        "rank %d of %s on %s (local rank %s)",
        rank,
        os.environ.get("WORLD_SIZE"),
        os.uname().nodename,
        os.environ.get("LOCAL_RANK"),
    )
    from ..sandbox.settings import SandboxSettings
    from .proxy_settings import ProxySettings
    from .recipe import Recipe
    from .tracking import Tracking

    recipe = Recipe.from_config(spec["train"])
    try:
        result = trl_in_process(
            recipe,
            spec["rows"],
            spec["model_dir"],
            Path(spec["work"]),
            ProxySettings.from_spec(spec["proxy"], where=f"${SPEC_ENV}: proxy"),
            SandboxSettings.from_spec(spec["sandbox"], where=f"${SPEC_ENV}: sandbox"),
            spec["provider"],
            tracking=Tracking.from_config(spec["train"]),
            tracking_dir=spec.get("tracking_dir"),
            attach=spec.get("attach"),
        )
    except TimeLimitStop as exc:
        log.warning("%s", exc.one_line())
        return EXIT_TIME_LIMIT
    except SweflowError as exc:
        log.error("%s", exc.one_line())
        return 1
    atomic_write_json(Path(spec["logs"]) / f"rank-{rank}.json", {"rank": rank, "host": os.uname().nodename,
                      "weights_sha256": result.get("weights_sha256")})  # fmt: skip
    if rank == 0:
        atomic_write_json(spec["result"], result)
    log.info("rank %d done", rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
