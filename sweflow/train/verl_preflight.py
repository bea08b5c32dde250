"""The verl launch's preflight (`python -m sweflow.train.verl_preflight`): run by the launch script on the
head node after Ray started, before verl's trainer.

It waits for the Ray nodes, checks the cluster and verl's composed trainer config, and writes a JSON report
(exit status 0 when every check passed, 3 otherwise); the steps are listed above `main`.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

# With SWEFLOW_VERL_PREFLIGHT_ONLY=1 the launch script stops after it (a cluster check before a long job, and
# what CI runs without GPUs).


def wait_for_nodes(want: int, timeout: float, poll: float = 2.0) -> list[dict[str, Any]]:
    """The alive Ray nodes once `want` of them joined; raises TimeoutError with the count seen."""
    import ray

    deadline = time.monotonic() + timeout
    alive: list[dict[str, Any]] = []
    while True:
        try:
            if not ray.is_initialized():
                ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
            alive = [n for n in ray.nodes() if n.get("Alive")]
        except Exception as exc:  # the head may not be up yet
            print(f"sweflow: waiting for ray: {exc}", file=sys.stderr)
            ray.shutdown()
        if len(alive) >= want:
            return alive
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(alive)} of {want} ray node(s) joined within {timeout:.0f} s")
        time.sleep(poll)


def probe_nodes(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One task pinned to each node: where it ran."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    def where() -> dict[str, Any]:
        return {"hostname": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id()}

    refs = [
        where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
        for n in nodes
    ]
    return ray.get(refs, timeout=300)


def cluster_problems(nodes: list[dict[str, Any]], probes: list[dict[str, Any]], cfg: Any, *, want_nodes: int,
          gpus_per_node: int) -> list[str]:  # fmt: skip
    """The problems found (empty: the cluster is the one the config asks for)."""
    problems = []
    if len(nodes) != want_nodes:
        problems.append(f"{len(nodes)} ray node(s) are alive, the recipe needs {want_nodes}")
    for n in nodes:
        gpus = float((n.get("Resources") or {}).get("GPU", 0))
        if gpus < gpus_per_node:
            problems.append(
                f"ray node {n['NodeID'][:12]} ({n.get('NodeManagerAddress')}) offers {gpus:g} GPU(s)"
            )
    ids = {n["NodeID"] for n in nodes}
    ran = {p["node_id"] for p in probes}
    if ran != ids:
        problems.append(f"the probe tasks ran on {len(ran)} of {len(ids)} node(s)")
    if int(cfg.trainer.nnodes) != want_nodes or int(cfg.trainer.n_gpus_per_node) != gpus_per_node:
        problems.append(
            f"the trainer config asks for {cfg.trainer.nnodes} node(s) x {cfg.trainer.n_gpus_per_node} GPU(s), "
            f"the cluster is {want_nodes} x {gpus_per_node}"
        )
    return problems


# 1. Waits until `--nodes` Ray nodes are alive (fails after `--timeout` seconds).
# 2. Checks the cluster: every node offers `--gpus-per-node` GPUs, and one Ray task pinned to each node runs
#   there (its hostname and Ray node id come back).
# 3. Composes verl's trainer config from the same overrides main_ppo gets (after `--`), strict, and checks
#   that its trainer.nnodes x trainer.n_gpus_per_node is the cluster that came up.
# 4. Writes the report as JSON to `--report`; exit status 0 when every check passed, 3 otherwise.
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sweflow.train.verl_preflight")
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--gpus-per-node", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--report", required=True)
    ap.add_argument("overrides", nargs="*", help="main_ppo's overrides, after --")
    args = ap.parse_args(argv)
    from ..util import atomic_write_json
    from .verl_engine import compose_verl_config

    t0 = time.monotonic()
    report: dict[str, Any] = {"want_nodes": args.nodes, "gpus_per_node": args.gpus_per_node}
    try:
        nodes = wait_for_nodes(args.nodes, args.timeout)
    except TimeoutError as exc:
        report["problems"] = [str(exc)]
        atomic_write_json(args.report, report)
        print(f"sweflow: {exc}", file=sys.stderr)
        return 3
    report["join_s"] = round(time.monotonic() - t0, 2)
    probes = probe_nodes(nodes)
    cfg = compose_verl_config(args.overrides)
    problems = cluster_problems(nodes, probes, cfg, want_nodes=args.nodes, gpus_per_node=args.gpus_per_node)
    report.update(
        nodes=[
            {
                "node_id": n["NodeID"],
                "address": n.get("NodeManagerAddress"),
                "gpus": float((n.get("Resources") or {}).get("GPU", 0)),
                "cpus": float((n.get("Resources") or {}).get("CPU", 0)),
            }
            for n in nodes
        ],  # fmt: skip
        probes=probes,
        trainer={
            "nnodes": int(cfg.trainer.nnodes),
            "n_gpus_per_node": int(cfg.trainer.n_gpus_per_node),
            "strategy": str(cfg.actor_rollout_ref.actor.strategy),
            "rollout": str(cfg.actor_rollout_ref.rollout.name),
            "total_training_steps": cfg.trainer.total_training_steps,
        },
        problems=problems,
        seconds=round(time.monotonic() - t0, 2),
    )
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.report, report)
    for p in problems:
        print(f"sweflow: preflight: {p}", file=sys.stderr)
    print(f"sweflow: preflight: {len(nodes)} ray node(s), {len(problems)} problem(s); report {args.report}")
    return 3 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
