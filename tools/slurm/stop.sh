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
