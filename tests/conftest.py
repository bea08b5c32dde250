"""Tiers and parallel groups of the whole suite (`make test` runs it on 2 xdist workers, `make test-fast` the
fast tier).

- `slow`: builds the embedded run or a Slurm cluster, or takes over ~10 s alone (marked where it is defined);
- `gpu`: needs a CUDA device, skipped without one;
- xdist groups: the tests that read the embedded run on one worker, the Slurm tests on one (one cluster
  per machine), the Docker tests on one (one engine, shared image tags); the rest spread over the workers.
  The embedded run itself is built once per session whichever worker asks first (tests/integration/
  conftest.py), so the Slurm comparison with it does not build it again.
"""

from __future__ import annotations

import pytest

EMBEDDED = {"embedded_local_run", "trained"}  # the one embedded run (built once, shared by the workers)
SLURM = {"slurm_cluster", "slurm_run"}  # one Slurm cluster on this machine: its tests on one worker


def _join_group(item, group: str) -> None:
    """What xdist's loadgroup does to a worker's item: its node id ends in @group, so the controller sends
    the whole group to one worker. (xdist 3.8 writes `item._nodeid`, which pytest 9 no longer reads.)"""
    item.add_marker(pytest.mark.xdist_group(group))
    if not item.nodeid.endswith(f"@{group}"):
        from _pytest.nodes import coerce_node_id

        item._id = coerce_node_id(f"{item.nodeid}@{group}")


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


EMBEDDED_TIMEOUT_S = 2400


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items):
    no_gpu = None
    grouping = bool(config.getvalue("loadgroup")) if hasattr(config.option, "loadgroup") else False
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        group = None
        if item.get_closest_marker("slurm") or names & SLURM:
            item.add_marker(pytest.mark.slow)
            group = "slurm"
        elif names & EMBEDDED:
            item.add_marker(pytest.mark.slow)
            # the first test to ask builds the whole embedded run in its setup, which pytest-timeout
            # counts: ~7 min alone, past 15 min on CI's 2 cores beside two busy workers
            if not item.get_closest_marker("timeout"):
                item.add_marker(pytest.mark.timeout(EMBEDDED_TIMEOUT_S))
            group = "embedded"
        elif item.get_closest_marker("docker"):
            group = "docker"
        if group and grouping:
            _join_group(item, group)
        if item.get_closest_marker("gpu"):
            no_gpu = (not _cuda()) if no_gpu is None else no_gpu
            if no_gpu:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
