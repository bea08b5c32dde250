"""`python tests/slurm_profile/fast_poll.py <snakemake args>`: snakemake, with the Slurm plugin's status
polling held at most CAP seconds apart. snakemake-executor-plugin-slurm 2.8.0 adds 10 s to the wait after
every poll that sees no job finish (up to 180 s), so on the test cluster each wave of short jobs waited about
half a minute to be seen. Tests only: a real site keeps the plugin's back-off (it spares slurmctld)."""

from __future__ import annotations

import sys

from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

CAP = 2.0


def _get(self):
    value = self._next_seconds_between_status_checks
    if value is None:
        return self.workflow.remote_execution_settings.seconds_between_status_checks
    return value


def _set(self, value):
    self._next_seconds_between_status_checks = None if value is None else min(float(value), CAP)


RemoteExecutor.next_seconds_between_status_checks = property(_get, _set)

if __name__ == "__main__":
    from snakemake.cli import main

    sys.argv[0] = "snakemake"
    main()
