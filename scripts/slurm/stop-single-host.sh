#!/bin/sh
# stop-single-host.sh: stop the one-host Slurm cluster that
# setup-single-host.sh started (slurmctld, slurmd, munged), by pid.
# Packages, the munge key and slurm.conf stay, so a later setup is quick.
set -u

dir=${HARNESS_DIR:-/var/tmp/titan-slurm}

[ "$(id -u)" = 0 ] || { echo "stop-single-host: must run as root" >&2; exit 1; }

scontrol shutdown >/dev/null 2>&1 || true
for f in "$dir/slurmctld.pid" "$dir/slurmd.pid" /run/munge/munged.pid; do
	[ -f "$f" ] || continue
	pid=$(cat "$f")
	i=0
	while kill -0 "$pid" 2>/dev/null; do
		[ $i = 0 ] && kill -TERM "$pid" 2>/dev/null
		i=$((i + 1))
		if [ $i -ge 50 ]; then
			kill -KILL "$pid" 2>/dev/null
			break
		fi
		sleep 0.1
	done
	echo "stop-single-host: stopped $(basename "$f" .pid) (pid $pid)"
done
