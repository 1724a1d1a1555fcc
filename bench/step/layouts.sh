#!/usr/bin/env bash
# Debug-model training throughput under each 2-process layout against one
# process with 2 threads, for one or more titan binaries side by side (a
# before/after comparison): recipes/llama3_debug.toml, STEPS steps logged
# every 4, tokens/s and MFU of the last two windows averaged. The binaries
# and layouts alternate ROUNDS times so that machine noise hits all.
#
# Usage: bench/step/layouts.sh [-r ROUNDS] [-s STEPS] [BINARY ...]
# (default: bin/titan, built by make).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=2 steps=16
while getopts r:s: o; do
	case $o in
	r) rounds=$OPTARG ;;
	s) steps=$OPTARG ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
if [ $# -eq 0 ]; then
	make -s build
	set -- bin/titan
fi
py=/usr/bin/python3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
layouts=(one-2threads FSDP2 TP2 CP2 PP2)
args_of() {
	case $1 in
	one-2threads) echo "--set training.threads=2" ;;
	FSDP2) echo "--nproc 2" ;;
	TP2) echo "--nproc 2 --set parallelism.tensor_parallel_degree=2 --set parallelism.data_parallel_shard_degree=1" ;;
	CP2) echo "--nproc 2 --set parallelism.context_parallel_degree=2 --set parallelism.data_parallel_shard_degree=1" ;;
	PP2) echo "--nproc 2 --set parallelism.pipeline_parallel_degree=2 --set parallelism.data_parallel_shard_degree=1 --set parallelism.pipeline_parallel_schedule=1F1B" ;;
	esac
}
for r in $(seq "$rounds"); do
	for l in "${layouts[@]}"; do
		for b in "$@"; do
			d="$out/run"
			rm -rf "$d"
			# shellcheck disable=SC2046
			"$b" train --recipe recipes/llama3_debug.toml --set training.steps="$steps" --set metrics.log_freq=4 \
				--set validation.enable=false --set checkpoint.enable=false --set job.dump_folder="$d" $(args_of "$l") >/dev/null 2>&1
			$py -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-2:]
print(sys.argv[2], sys.argv[3], sys.argv[4], sum(x["tokens_per_sec"] for x in r) / 2, sum(x["mfu"] for x in r) / 2)' "$d/metrics.jsonl" "$r" "$l" "$b" >>"$out/results"
			echo "round $r $l $b done" >&2
		done
	done
done
$py - "$out/results" "$@" <<'PY'
import sys, collections
rows = [l.split() for l in open(sys.argv[1])]
bins = sys.argv[2:]
tps = collections.defaultdict(list); mfu = collections.defaultdict(list)
for _, l, b, t, m in rows:
    tps[l, b].append(float(t)); mfu[l, b].append(float(m))
med = lambda xs: sorted(xs)[len(xs) // 2]
print("%-13s" % "layout" + "".join("  %-34s" % b for b in bins))
for l in ["one-2threads", "FSDP2", "TP2", "CP2", "PP2"]:
    cells = []
    for b in bins:
        t, one = med(tps[l, b]), med(tps["one-2threads", b])
        cells.append("%7.0f tok/s %5.2f× one  mfu %5.1f%%" % (t, t / one, med(mfu[l, b])))
    print("%-13s" % l + "".join("  %-34s" % c for c in cells))
PY
