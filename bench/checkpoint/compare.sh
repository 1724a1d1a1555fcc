#!/usr/bin/env bash
# Checkpoint cost, side by side in one run:
#
#  1. how long a save blocks the training loop, as a share of a step, on
#     the debug model (recipes/llama3_debug.toml, one process): STEPS
#     steps with a full checkpoint every 5, under each
#     checkpoint.async_mode; the share is what titan logs with each save
#     ("loop blocked X ms (Y% of a step)"), averaged over the saves before
#     the last (the last save is always written before the run ends);
#  2. save and load throughput of MiB of state (internal/checkpoint's
#     BenchmarkSave and BenchmarkLoad: 1 and 4 ranks writing their shards
#     in parallel, fsync and commit included; a load opens, verifies every
#     checksum and reads its range on every rank) against dd writing the
#     same bytes with conv=fsync and reading them back, on the same disk
#     (BENCH_DIR, default $TMPDIR). Reads are from the page cache for dd
#     and titan alike (nothing is dropped).
#
# Usage: bench/checkpoint/compare.sh [STEPS] [MiB]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps="${1:-40}"
mib="${2:-256}"
base="${BENCH_DIR:-${TMPDIR:-/tmp}}"
dir=$(mktemp -d -p "$base" titan-bench-ckpt-XXXXXX)
trap 'rm -rf "$dir"' EXIT
make -s build

echo "== loop blocked by a save (debug model, one process, $steps steps, a full save every 5)"
for mode in disabled async async_with_pinned_mem; do
	rm -rf "$dir/run"
	./bin/titan train --recipe recipes/llama3_debug.toml --set training.steps="$steps" \
		--set checkpoint.enable=true --set checkpoint.interval=5 --set checkpoint.async_mode="$mode" \
		--set checkpoint.last_save_model_only=false --set metrics.log_freq=10 --set metrics.enable_db=false \
		--set job.dump_folder="$dir/run" > "$dir/train.log" 2>&1
	awk -v mode="$mode" -v last="step-$steps " '
		/loop blocked/ && index($0, last) == 0 {
			match($0, /loop blocked [0-9.]+ ms \([0-9.]+% of a step\)/)
			split(substr($0, RSTART, RLENGTH), f, /[ (%]+/)
			ms += f[3]; pct += f[5]; n++; if (f[5] > worst) worst = f[5]
			match($0, /in [0-9.]+ ms$/); w += substr($0, RSTART + 3, RLENGTH - 6)
		}
		END {
			if (n == 0) { print mode ": no save logged"; exit 1 }
			printf "%-22s %d saves: loop blocked %.1f ms on average, %.2f%% of a step (worst %.2f%%); written in %.0f ms on average\n", mode, n, ms / n, pct / n, worst, w / n
		}' "$dir/train.log"
done
du -sh "$dir/run/checkpoint/step-$steps" | awk '{ print "a full checkpoint of the debug model: " $1 }'

echo "== throughput of $mib MiB on $base"
TITAN_BENCH_DIR="$dir" TITAN_BENCH_CKPT_MIB="$mib" go test -run '^$' -bench 'Benchmark(Save|Load)$' -benchtime 3x ./internal/checkpoint |
	awk '/MB\/s/ { printf "titan %-22s %8s MB/s\n", $1, $(NF-1) }'
sync
dd if=/dev/zero of="$dir/dd.bin" bs=1M count="$mib" conv=fsync 2>&1 | awk '/copied/ { print "dd write (conv=fsync)         " $(NF-1), $NF }'
dd if="$dir/dd.bin" of=/dev/null bs=1M 2>&1 | awk '/copied/ { print "dd read                       " $(NF-1), $NF }'
