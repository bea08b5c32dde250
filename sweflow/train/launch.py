"""Where the TRL trainer's processes run: in this process, under torchrun here, or under torchrun on every
node of the Slurm allocation (one static rendezvous on the first node).

`plan(...)` turns a recipe's world size into the command that starts its processes (see above `plan`);
they run `python -m sweflow.train.worker` and get what they train in `$SWEFLOW_TRAIN_SPEC` (JSON).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import TrainError
from ..slurm import Node, allocation_nodes
from ..util import free_port, log
from .recipe import Recipe

# The processes run `python -m sweflow.train.worker`; what they train comes in `$SWEFLOW_TRAIN_SPEC` (JSON),
# which the worker removes from its environment before it starts anything (no sandbox, proxy or child inherits
# it).
WORKER_MODULE = "sweflow.train.worker"
SPEC_ENV = "SWEFLOW_TRAIN_SPEC"


@dataclass(frozen=True)
class Launch:
    """How to start the trainer: `argv` None means in this process."""

    argv: list[str] | None
    world_size: int
    nodes: list[Node] = field(default_factory=list)
    rendezvous: str | None = None

    def describe(self) -> str:
        if self.argv is None:
            return "1 process, in the rule's own process"
        where = ", ".join(f"{n.name} ({n.addr})" for n in self.nodes) or "this machine"
        return f"{self.world_size} process(es) on {where}; rendezvous {self.rendezvous}"


def processes_per_node(recipe: Recipe) -> int:
    return max(recipe.parallel.gpus_per_node, 1)


# A recipe's world size is `parallel.nodes x max(parallel.gpus_per_node, 1)` (one process per GPU, one per
# node on CPU, where torch.distributed uses gloo). `plan(...)` turns it into the command that starts them:
#
# - world size 1: no command (the rule's own process trains);
# - inside a Slurm job (`$SLURM_JOB_ID`, the only Slurm variable Snakemake's plugin leaves): one `srun` task
#   per node of the allocation (`--overlap`: the batch step already holds the allocation), each a torchrun
#   agent with `--node-rank=$SLURM_NODEID` (srun sets it for its tasks), the rendezvous at the first node's
#   address (the batch step runs there, so a free port is picked there);
# - outside Slurm with world size > 1: torchrun with every process on this machine (a multi-GPU box, or a CPU
#   rehearsal of a multi-node recipe).
def plan(
    recipe: Recipe,
    *,
    python: str,
    job_id: str | None = None,
    nodes: Sequence[Node] | None = None,
    port: int | None = None,
) -> Launch:
    """The launch of `recipe`'s processes (see the comment above). `nodes`: the allocation's nodes when
    already known (else asked of Slurm by `job_id`); `port`: the rendezvous port (else a free one here)."""
    p = recipe.parallel
    world = p.world_size
    if world == 1:
        return Launch(None, 1)
    nproc = processes_per_node(recipe)
    if job_id:
        found = list(nodes) if nodes is not None else allocation_nodes(job_id)
        if len(found) != p.nodes:
            raise TrainError(
                f"the Slurm allocation {job_id} has {len(found)} node(s) "
                f"({', '.join(n.name for n in found) or 'none'}) and the recipe needs {p.nodes}",
                field="train.parallel.nodes",
                hint="the train_grpo rule's resources take the node count from train.parallel.nodes",
            )
        head, port = found[0].addr, port or free_port()
        # the node rank is srun's per-task SLURM_NODEID, so it is expanded by the task's own shell
        inner = _torchrun(python, p.nodes, nproc, head, port, node_rank='"$SLURM_NODEID"')
        argv = [
            "srun", f"--jobid={job_id}", f"--nodes={p.nodes}", f"--ntasks={p.nodes}",
            "--ntasks-per-node=1", "--overlap", "--kill-on-bad-exit=1",
            f"--nodelist={','.join(n.name for n in found)}",
            "bash", "-c", "exec " + inner,
        ]  # fmt: skip
        return Launch(argv, world, found, f"{head}:{port}")
    if p.nodes > 1:
        log.warning(
            "train.parallel.nodes is %d but this is not a Slurm job: all %d processes run on this machine",
            p.nodes,
            world,
        )
    port = port or free_port()
    argv = shlex.split(_torchrun(python, 1, world, "127.0.0.1", port, node_rank="0"))
    return Launch(argv, world, [], f"127.0.0.1:{port}")


def _torchrun(python: str, nnodes: int, nproc: int, addr: str, port: int, *, node_rank: str) -> str:
    """The torchrun command line (shell words; `node_rank` is inserted as written) for the worker."""
    q = shlex.quote
    return (
        f"{q(python)} -m torch.distributed.run --node-rank={node_rank} --nnodes={nnodes} "
        f"--nproc-per-node={nproc} --master-addr={q(addr)} --master-port={port} --max-restarts=0 "
        f"-m {WORKER_MODULE}"
    )
