#!/usr/bin/env bash
# Stop the daemons started by start.sh, by the PIDs in their pid files, and wait until they are gone.
# --slurm-only leaves munged running.
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
files=(/run/slurm/slurmd.pid /run/slurm/slurmctld.pid)
[ "${1:-}" = --slurm-only ] || files+=(/run/munge/munged.pid)
for f in "${files[@]}"; do
  pid="$(cat "$f" 2>/dev/null || true)"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    echo "stopped $(basename "$f" .pid) (pid $pid)"
  fi
done
# Remove the config start.sh wrote (and only that one): with a slurm.conf but no controller, every
# `scontrol` call waits ~9 s, and Snakemake's SLURM plugin calls it at each start-up, even for local runs.
if [ "${1:-}" != --slurm-only ] && grep -q '^ClusterName=shardsmith-test$' /etc/slurm/slurm.conf 2>/dev/null; then
  rm -f /etc/slurm/slurm.conf /etc/slurm/gres.conf
  echo "removed /etc/slurm/slurm.conf and gres.conf written by start.sh"
fi
