"""One process of a data-parallel TRL GRPO run (`python -m sweflow.stages.train_worker`, started by
torchrun on each node; see sweflow.train.launch).

Reads its spec from $SWEFLOW_TRAIN_SPEC and removes it from the environment first, so no proxy, sandbox or
child process inherits the live config. Logs to <logs>/rank-<RANK>.log. Every rank rolls out its share of
each step through its own proxy and sandboxes; torch.distributed (gloo on CPU, NCCL on GPUs) averages the
gradients; rank 0 writes the metrics, rollout records, checkpoints and <result>.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..errors import SweflowError
from ..train.launch import SPEC_ENV
from ..util import atomic_write_json, setup_logging


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
    from ..train.recipe import Recipe
    from .train import trl_in_process

    recipe = Recipe.from_config(spec["train"])
    try:
        result = trl_in_process(
            recipe,
            spec["rows"],
            spec["model_dir"],
            Path(spec["work"]),
            spec["train"],
            spec["sandbox"],
            spec["provider"],
        )
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
