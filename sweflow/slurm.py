"""The Slurm allocation a step runs in, as far as a job can see it.

Everything is asked of Slurm by job id (`squeue`, `scontrol show node`). `current_job()`: {job_id, nodes,
partition} of $SLURM_JOB_ID, or None outside Slurm (provenance). `allocation_nodes(job_id)`: the
allocation's nodes, each with its address (launchers).
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass
from typing import Any

from .errors import SweflowError
from .util import log, run_cmd

# Snakemake's Slurm executor plugin strips every `SLURM_*` variable but `SLURM_JOB_ID` from a job's
# environment, so everything here is asked of Slurm by job id: the node list and partition from `squeue`, each
# node's address from `scontrol show node` (nodes of a one-machine test cluster share a host but have their
# own names; their NodeAddr is what other processes connect to).


class SlurmError(SweflowError):
    """Slurm could not tell what the allocation is."""


@dataclass(frozen=True)
class Node:
    name: str
    addr: str


def _run(cmd: list[str]) -> str:
    if not shutil.which(cmd[0]):
        raise SlurmError(f"{cmd[0]} is not on PATH", hint="run inside a Slurm allocation")
    res = run_cmd(cmd, timeout=60)
    if res.returncode != 0:
        raise SlurmError(f"`{' '.join(cmd)}` failed: {(res.stderr or res.stdout).strip()[:300]}")
    return res.stdout


def hostnames(nodelist: str) -> list[str]:
    """A Slurm node list expression (`n[1-2],gpu7`) as names, through `scontrol show hostnames`."""
    if not nodelist.strip():
        return []
    return [x for x in _run(["scontrol", "show", "hostnames", nodelist.strip()]).split() if x]


def job_fields(job_id: str) -> dict[str, str]:
    """Node list expression and partition of a job, from squeue (no accounting database needed)."""
    out = _run(["squeue", "-h", "-j", str(job_id), "-o", "%N|%P"]).strip().splitlines()
    if not out:
        raise SlurmError(f"squeue does not know job {job_id}")
    nodelist, _, partition = out[0].partition("|")
    return {"nodelist": nodelist.strip(), "partition": partition.strip()}


def node_addr(name: str) -> str:
    """The address a node is reached at (NodeAddr; the name itself when Slurm gives none)."""
    for tok in _run(["scontrol", "show", "node", "-o", name]).split():
        if tok.startswith("NodeAddr="):
            return tok.split("=", 1)[1] or name
    return name


def allocation_nodes(job_id: str) -> list[Node]:
    """The nodes of job `job_id`, in Slurm's order (the batch step runs on the first)."""
    names = hostnames(job_fields(job_id)["nodelist"])
    if not names:
        raise SlurmError(f"job {job_id} has no nodes (is it running?)")
    return [Node(n, node_addr(n)) for n in names]


@functools.lru_cache(maxsize=4)
def _job(job_id: str) -> dict[str, Any] | None:
    try:
        fields = job_fields(job_id)
        return {
            "job_id": job_id,
            "nodes": hostnames(fields["nodelist"]),
            "partition": fields["partition"],
        }
    except SlurmError as exc:  # provenance must not fail the job: keep what is known
        log.warning("slurm job details unavailable: %s", exc.one_line())
        return {"job_id": job_id, "nodes": None, "partition": None}


def current_job() -> dict[str, Any] | None:
    """{job_id, nodes, partition} of the Slurm job this process runs in; None outside Slurm."""
    job_id = os.environ.get("SLURM_JOB_ID", "").strip()
    return _job(job_id) if job_id else None
