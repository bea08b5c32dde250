"""Where a TRL run's processes go (sweflow.train.launch): the plan's commands, without starting them. The
real launches run in tests/unit/test_trl_engine.py (torchrun, 2 ranks) and tests/integration/test_slurm.py
(srun over a 2-node allocation)."""

from __future__ import annotations

import subprocess

import pytest

from sweflow.errors import TrainError
from sweflow.slurm import Node
from sweflow.train.launch import WORKER_MODULE, plan
from sweflow.train.recipe import Parallel, Recipe


def recipe(nodes=1, gpus=0):
    return Recipe(parallel=Parallel(nodes=nodes, gpus_per_node=gpus))


def test_one_process_trains_in_the_rules_own_process():
    launch = plan(recipe(), python="/py")
    assert launch.argv is None and launch.world_size == 1


def test_several_processes_without_slurm_run_under_torchrun_here():
    launch = plan(recipe(gpus=4), python="/py", port=29123)
    assert launch.world_size == 4
    assert launch.argv[:3] == ["/py", "-m", "torch.distributed.run"]
    assert "--nproc-per-node=4" in launch.argv and "--nnodes=1" in launch.argv
    assert launch.argv[-2:] == ["-m", WORKER_MODULE] and launch.rendezvous == "127.0.0.1:29123"


def test_a_slurm_allocation_gets_one_torchrun_agent_per_node_with_the_first_as_rendezvous():
    nodes = [Node("gpu7", "10.0.0.7"), Node("gpu8", "10.0.0.8")]
    launch = plan(recipe(nodes=2, gpus=8), python="/env/py", job_id="4242", nodes=nodes, port=29400)
    argv = launch.argv
    assert launch.world_size == 16 and launch.rendezvous == "10.0.0.7:29400"
    assert argv[0] == "srun" and "--jobid=4242" in argv and "--overlap" in argv
    assert "--nodes=2" in argv and "--ntasks=2" in argv and "--ntasks-per-node=1" in argv
    assert "--nodelist=gpu7,gpu8" in argv
    inner = argv[argv.index("-c") + 1]
    # the node rank is each srun task's own SLURM_NODEID, expanded by that task's shell
    shown = subprocess.run(["bash", "-c", inner.replace("exec /env/py", "exec echo /env/py")],
                           env={"SLURM_NODEID": "1", "PATH": "/usr/bin:/bin"}, capture_output=True,
                           text=True, check=True).stdout.split()  # fmt: skip
    assert "--node-rank=1" in shown and "--nnodes=2" in shown and "--nproc-per-node=8" in shown
    assert "--master-addr=10.0.0.7" in shown and "--master-port=29400" in shown
    assert shown[-2:] == ["-m", WORKER_MODULE]


def test_an_allocation_of_the_wrong_size_is_one_line_naming_the_field():
    with pytest.raises(TrainError) as err:
        plan(recipe(nodes=4), python="/py", job_id="7", nodes=[Node("n1", "n1")], port=1)
    msg = err.value.one_line()
    assert "field 'train.parallel.nodes'" in msg and "has 1 node(s) (n1)" in msg and "needs 4" in msg
