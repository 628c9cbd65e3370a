#!/usr/bin/env bash
# Bring up a single-node SLURM on this host for tests: controller and node on localhost, Debian bookworm
# packages (slurm-wlm, munge), run as root. No systemd, no cgroups, no slurmdbd, so it works in containers.
# Idempotent: daemons already running with the same configuration are left alone. Stop with stop.sh.
#
#   bash tools/slurm/start.sh
#
# The node declares max(real, SLURM_TEST_CPUS=32) CPUs, max(real, SLURM_TEST_MEM_MB=65536) MB and two GPUs
# (see slurm.conf.template for why). Prints the daemons' PIDs; exits non-zero if SLURM does not come up,
# 3 if /etc/slurm/slurm.conf exists and was not written by this script.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ "$(id -u)" = 0 ] || { echo "start.sh: must run as root (starts munged, slurmctld, slurmd)" >&2; exit 1; }

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
   || ! command -v sbatch >/dev/null; then
  echo "start.sh: installing slurm-wlm and munge"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurm-wlm slurmctld slurmd slurm-client munge >/dev/null
fi

# Never overwrite a real site's configuration: only a file this script wrote (its ClusterName) is replaced.
if [ -e /etc/slurm/slurm.conf ] && ! grep -q '^ClusterName=shardsmith-test$' /etc/slurm/slurm.conf; then
  echo "start.sh: /etc/slurm/slurm.conf belongs to another SLURM set-up; not touching it" >&2
  exit 3
fi

HOST="$(hostname -s)"
CPUS="$(nproc)"; CPUS=$(( CPUS > ${SLURM_TEST_CPUS:-32} ? CPUS : ${SLURM_TEST_CPUS:-32} ))
MEM="$(slurmd -C | grep -o 'RealMemory=[0-9]*' | cut -d= -f2)"
MEM=$(( MEM > ${SLURM_TEST_MEM_MB:-65536} ? MEM : ${SLURM_TEST_MEM_MB:-65536} ))

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm /run/slurm
chown -R slurm:slurm /var/lib/slurm /var/log/slurm /run/slurm
new_conf="$(mktemp)"; new_gres="$(mktemp)"
trap 'rm -f "$new_conf" "$new_gres"' EXIT
fill() { sed -e "s/@HOST@/$HOST/g" -e "s/@CPUS@/$CPUS/g" -e "s/@MEM@/$MEM/g" "$1"; }
fill "$HERE/slurm.conf.template" >"$new_conf"
fill "$HERE/gres.conf.template" >"$new_gres"
if ! cmp -s "$new_conf" /etc/slurm/slurm.conf || ! cmp -s "$new_gres" /etc/slurm/gres.conf; then
  # A different configuration: restart whatever runs with the old one.
  if alive /run/slurm/slurmd.pid || alive /run/slurm/slurmctld.pid; then bash "$HERE/stop.sh" --slurm-only; fi
  install -m 644 "$new_conf" /etc/slurm/slurm.conf
  install -m 644 "$new_gres" /etc/slurm/gres.conf
fi

# munge key (the Debian package normally creates one; make sure)
if [ ! -s /etc/munge/munge.key ]; then
  if command -v mungekey >/dev/null; then mungekey --create --force; else
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; fi
fi
chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge

wait_for() {  # wait_for <tries> <command...>: retry every 0.2 s
  local n="$1"; shift
  for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}
alive /run/munge/munged.pid || runuser -u munge -- /usr/sbin/munged   # daemonizes, writes its pid file
wait_for 50 munge -n || { echo "start.sh: munged did not start" >&2; exit 1; }

ctld_up() { scontrol ping | grep -q UP; }
alive /run/slurm/slurmctld.pid || /usr/sbin/slurmctld   # drops to SlurmUser=slurm
wait_for 100 ctld_up || { echo "start.sh: slurmctld did not start; see /var/log/slurm/slurmctld.log" >&2; exit 1; }
alive /run/slurm/slurmd.pid || /usr/sbin/slurmd
node_ready() { sinfo -h -N -o %t | head -1 | grep -qE '^(idle|mix|alloc)$'; }
if ! wait_for 150 node_ready; then
  scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
  wait_for 50 node_ready || { sinfo -N -l >&2; echo "start.sh: node not ready; see /var/log/slurm/" >&2; exit 1; }
fi
sinfo
echo "munged pid $(cat /run/munge/munged.pid), slurmctld pid $(cat /run/slurm/slurmctld.pid)," \
     "slurmd pid $(cat /run/slurm/slurmd.pid)"
