#!/bin/sh
# setup-single-host.sh: install, configure and start a one-host Slurm cluster
# (munged + slurmctld + slurmd) for titan's launcher integration tests.
#
# Usage (as root):  scripts/slurm/setup-single-host.sh
#                   go test -run TestSlurm -v ./internal/launch
#                   scripts/slurm/stop-single-host.sh    # tear it down
#
# Idempotent: it installs slurm-wlm and munge only when missing, keeps an
# existing munge key, rewrites slurm.conf only when it changes, and starts
# only the daemons that are not answering. It ends with `sinfo` showing the
# node idle and a check that `srun -n 4 hostname` runs four tasks.
#
# The node declares the CPU count that `slurmd -C` detects, but at least
# HARNESS_CPUS (default 4) CPUs, with SlurmdParameters=config_overrides so
# slurmd accepts the overstatement; 4 tasks then fit on a 2-core VM with a
# plain `srun -n 4`. (`--overcommit` works as well.) Nothing here is meant for
# a shared or production machine: SlurmUser is root and the munge key is
# local.
#
# Environment:
#   HARNESS_DIR   state, spool and log folder (default /var/tmp/titan-slurm)
#   HARNESS_CPUS  minimum CPUs the node claims (default 4)
set -eu

dir=${HARNESS_DIR:-/var/tmp/titan-slurm}
mincpus=${HARNESS_CPUS:-4}
conf=/etc/slurm/slurm.conf

log() { echo "slurm-setup: $*"; }
die() { echo "slurm-setup: error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons)"

# 1. Packages.
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 ||
	! command -v srun >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
	log "installing slurm-wlm and munge (log: $dir/apt.log)"
	mkdir -p "$dir"
	export DEBIAN_FRONTEND=noninteractive
	{ apt-get update -q && apt-get install -y -q slurm-wlm munge; } >"$dir/apt.log" 2>&1 ||
		{ tail -n 20 "$dir/apt.log" >&2; die "apt-get install slurm-wlm munge failed (see $dir/apt.log)"; }
	# Debian's postinst may start daemons through init scripts; the service
	# manager is usually absent in containers, so we manage them ourselves.
fi

# 2. munge.
id munge >/dev/null 2>&1 || die "user munge missing after installing munge"
mkdir -p /etc/munge /run/munge /var/log/munge /var/lib/munge
if [ ! -s /etc/munge/munge.key ]; then
	log "creating /etc/munge/munge.key"
	dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
fi
chown munge:munge /etc/munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge
chmod 700 /etc/munge
chmod 400 /etc/munge/munge.key
chmod 755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
	log "starting munged"
	# A stale pid or socket file from a killed munged blocks a new one.
	if [ -f /run/munge/munged.pid ] && ! kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; then
		rm -f /run/munge/munged.pid /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
	fi
	su munge -s /bin/sh -c /usr/sbin/munged || die "munged did not start (see /var/log/munge/munged.log)"
	i=0
	until munge -n 2>/dev/null | unmunge >/dev/null 2>&1; do
		i=$((i + 1))
		[ $i -lt 50 ] || die "munge -n | unmunge still fails after starting munged"
		sleep 0.1
	done
fi
log "munge ok"

# 3. slurm.conf.
host=$(hostname -s)
hw=$(slurmd -C | head -n 1)
field() { echo "$hw" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
cpus=$(field CPUs)
mem=$(field RealMemory)
[ -n "$cpus" ] && [ -n "$mem" ] || die "could not read CPUs and RealMemory from 'slurmd -C': $hw"
[ "$cpus" -ge "$mincpus" ] || cpus=$mincpus
mem=$((mem * 9 / 10)) # slurmd drains a node that claims more memory than it has
mkdir -p "$dir/state" "$dir/spool" /etc/slurm
tmp=$(mktemp)
cat >"$tmp" <<EOF
# Written by titan scripts/slurm/setup-single-host.sh; rewritten on every run.
ClusterName=local
SlurmctldHost=$host
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/ctld.log
SlurmdLogFile=$dir/d.log
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
NodeName=$host CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
changed=0
if ! cmp -s "$tmp" "$conf"; then
	mv "$tmp" "$conf"
	chmod 644 "$conf"
	changed=1
	log "wrote $conf (node $host, $cpus CPUs, ${mem} MiB)"
else
	rm -f "$tmp"
fi

# 4. Daemons. A config change restarts them (scontrol reconfigure cannot
# change node definitions in slurm 22.05).
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
if [ $changed = 1 ] && { running "$dir/slurmctld.pid" || running "$dir/slurmd.pid"; }; then
	log "configuration changed: restarting slurmctld and slurmd"
	scontrol shutdown >/dev/null 2>&1 || true
	i=0
	while running "$dir/slurmctld.pid" || running "$dir/slurmd.pid"; do
		i=$((i + 1))
		[ $i -lt 100 ] || die "slurm daemons did not stop after scontrol shutdown"
		sleep 0.1
	done
fi
if ! running "$dir/slurmctld.pid"; then
	log "starting slurmctld"
	slurmctld -c || die "slurmctld did not start (see $dir/ctld.log)"
fi
if ! running "$dir/slurmd.pid"; then
	log "starting slurmd"
	slurmd -c || die "slurmd did not start (see $dir/d.log)"
fi

# 5. Wait for the node.
i=0
while :; do
	state=$(sinfo -h -n "$host" -o %T 2>/dev/null | head -n 1 || true)
	case $state in
	idle | mixed | allocated | completing) break ;;
	down* | drain* | drained)
		scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
		;;
	esac
	i=$((i + 1))
	[ $i -lt 150 ] || die "node $host is '$state' after 30 s (see $dir/ctld.log and $dir/d.log; sinfo -R gives the reason)"
	sleep 0.2
done
log "node $host is $state"

# 6. Smoke test.
n=$(timeout 60 srun -n 4 hostname | wc -l) || die "srun -n 4 hostname failed"
[ "$n" = 4 ] || die "srun -n 4 hostname printed $n lines, want 4"
log "srun -n 4 hostname ran 4 tasks; cluster ready"
