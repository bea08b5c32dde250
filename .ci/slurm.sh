#!/bin/bash
# A real one-machine Slurm for tests (run by the slurm_cluster fixture of tests/integration/conftest.py):
# Debian's slurm-wlm 22.05 + munge, one slurmctld and N slurmd processes with their own NodeName and port,
# one fake GPU each (gres on /dev/null), a cpu and a gpu partition, no accounting database. Memory is not enforced here (no cgroups),
# so the nodes declare 500 GB and the user profile's mem_mb values schedule unchanged.
# usage: .ci/slurm.sh up|down ; env SLURM_NNODES (default 2), SLURM_BASE (default /tmp/slurmci/run)
# Profiles that use it need `slurm-status-command: squeue` (the plugin's default, sacct, has no accounting
# here and a run would hang, ignoring SIGTERM: wrap CI runs in `timeout -k`) and MinJobAge (1800 here) >=
# 3 x slurm-init-seconds-before-status-checks (else the plugin silently goes back to sacct). Measured with
# plugin 2.8: --slurm-no-account is a no-op (without slurm_account it submits without -A, which works);
# status polls back off by 10 s per idle check (up to 180 s), so a finished job can take ~100 s to be
# noticed; cancelled / timed-out jobs are reported with their job id and log and resubmitted by `retries:`.
# Do not set OverSubscribe on the cpu partition (jobs sat pending ~85 s): CPUs=4 + config_overrides instead.
set -euo pipefail
BASE=${SLURM_BASE:-/tmp/slurmci/run}
N=${SLURM_NNODES:-2}
ETC=/etc/slurm
up() {
  t0=$(date +%s%N)
  if ! command -v slurmctld >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm slurm-client munge >/dev/null
  fi
  mkdir -p "$BASE"/{state,log,spool} /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  [ -s /etc/munge/munge.key ] || { mungekey -c -f 2>/dev/null || create-munge-key -f; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  if ! munge -n >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged
    for i in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  host=$(hostname -s)
  nodes=$(seq -f "n%g" 1 "$N" | paste -sd,)
  {
  cat <<CONF
ClusterName=ci
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
SlurmctldPidFile=$BASE/slurmctld.pid
SlurmdPidFile=$BASE/slurmd.%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=1800
KillWait=5
InactiveLimit=0
Waittime=0
CONF
  i=0
  for n in $(seq 1 "$N"); do
    echo "NodeName=n$n NodeHostname=$host NodeAddr=127.0.0.1 Port=$((17000+n)) CPUs=4 RealMemory=512000 Gres=gpu:1 State=UNKNOWN"
  done
  echo "PartitionName=cpu Nodes=$nodes Default=YES MaxTime=INFINITE State=UP"
  echo "PartitionName=gpu Nodes=$nodes Default=NO MaxTime=INFINITE State=UP"
  } > $ETC/slurm.conf
  printf 'AutoDetect=off\nNodeName=n[1-%s] Name=gpu File=/dev/null\n' "$N" > $ETC/gres.conf
  slurmctld -i
  for n in $(seq 1 "$N"); do slurmd -N n$n; done
  idle=0
  for i in $(seq 300); do
    idle=$(sinfo -h -N -p cpu -t idle -o %N 2>/dev/null | sort -u | wc -l)
    [ "$idle" -ge "$N" ] && break; sleep 0.1
  done
  [ "$idle" -ge "$N" ] || { echo "slurm: only $idle of $N nodes idle after 30 s (see $BASE/log)" >&2; exit 1; }
  echo "slurm up: $N nodes idle after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  sinfo
}
down() {
  for f in "$BASE"/slurmd.*.pid "$BASE"/slurmctld.pid; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
  done
  sleep 1
  [ -f /run/munge/munged.pid ] && kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
  rm -rf "$BASE"
  # the config this script wrote goes too: with it and no controller, every `scontrol` waits ~10 s, and the
  # Slurm executor plugin runs `scontrol show config` when Snakemake loads it (every snakemake start)
  rm -f $ETC/slurm.conf $ETC/gres.conf
}
"$@"
