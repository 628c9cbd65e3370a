#!/usr/bin/env bash
# Scheduled refresh of one dataset: re-read the sources, run only new or changed parts, publish a new
# version (the config should say `version: auto`). Two refreshes never overlap: the second one finds the
# lock held and exits 0 without doing anything.
#
#   tools/schedule/refresh.sh CONFIG [more snakemake options, e.g. --workflow-profile /path/to/shardsmith/cluster]
#
# Runs in the current folder (relative paths in CONFIG resolve there). Environment:
#   SHARDSMITH_CORES  cores for local jobs (default: all of this machine or allocation)
#   SHARDSMITH_LOCK   lock file (default: ./.shardsmith-refresh.lock; on shared storage for SLURM)
#   SHARDSMITH_VENV   the virtualenv made by `make setup` (default: the repo's .venv)
# AWS credentials come from the usual AWS environment (AWS_PROFILE, ~/.aws, an instance role); never
# put them in this script, a crontab or a unit file.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 CONFIG [snakemake options]" >&2
  exit 2
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
config="$(realpath "$1")"
shift
venv="${SHARDSMITH_VENV:-$repo/.venv}"
lock="${SHARDSMITH_LOCK:-$PWD/.shardsmith-refresh.lock}"
cores="${SHARDSMITH_CORES:-$(nproc)}"

exec 9>>"$lock"
if ! flock --nonblock 9; then
  echo "$(date -u +%FT%TZ) refresh: another refresh holds $lock; skipping this run"
  exit 0
fi
echo "$(date -u +%FT%TZ) refresh: $config (lock $lock, $cores cores)"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
"$venv/bin/python" -m shardsmith refresh --configfile "$config" --cores "$cores" "$@"
