#!/usr/bin/env bash
# Predicted (titan plan) against measured (titan train) tokens/s per
# process and peak memory per process of the debug model
# (recipes/llama3_debug.toml: local batch 8 × 256 tokens) under layouts of
# 1, 2 and 4 worker processes on this machine.
#
# Usage: bench/plan/measure.sh [-c] [-s STEPS] [-r ROUNDS] [LAYOUT ...]
#   -c         recalibrate first (titan plan --calibrate), into
#              $TITAN_PLAN_CALIBRATION or the user's cache folder
#   -s STEPS   training steps per run (default 16, logged every 4; the
#              last two windows are averaged, the first is warm-up)
#   -r ROUNDS  runs per layout (default 1); the median is reported
# Prints a markdown table, then per process count the layouts in predicted
# and in measured order (the ranking --search would make, checked) with
# the pairs the prediction inverts; raw numbers go to
# bench/plan/results.jsonl, and
# the run as a plot to bench/plan/this_machine.png (bench/plan/plotmeasured).
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=16 rounds=1 cal=0
while getopts cs:r: o; do
	case $o in
	c) cal=1 ;;
	s) steps=$OPTARG ;;
	r) rounds=$OPTARG ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
make -s build
bin=bin/titan
py=/usr/bin/python3
[ "$cal" = 1 ] && $bin plan --calibrate
all=(one FSDP2 FSDP4 DDP2 TP2 TP4 CP2 PP2-1F1B PP2-GPipe PP2-Interleaved1F1B FSDP2xTP2 one-bf16 FSDP2-bf16)
[ $# -gt 0 ] && all=("$@")
# A layout name ending in -bf16 is that layout under bfloat16 mixed
# precision (training.mixed_precision_param); in -opac or -fullac, under
# per-operation selective or full activation checkpointing.
sets_of() {
	local s="--set parallelism.data_parallel_shard_degree=1"
	case $1 in
	*-bf16) echo "$(sets_of "${1%-bf16}") --set training.mixed_precision_param=bfloat16" ;;
	*-opac) echo "$(sets_of "${1%-opac}") --set activation_checkpoint.mode=selective --set activation_checkpoint.selective_ac_option=op" ;;
	*-fullac) echo "$(sets_of "${1%-fullac}") --set activation_checkpoint.mode=full" ;;
	one) echo "1 $s" ;;
	FSDP2) echo "2 --set parallelism.data_parallel_shard_degree=2" ;;
	FSDP4) echo "4 --set parallelism.data_parallel_shard_degree=4" ;;
	DDP2) echo "2 $s --set parallelism.data_parallel_replicate_degree=2" ;;
	TP2) echo "2 $s --set parallelism.tensor_parallel_degree=2" ;;
	TP4) echo "4 $s --set parallelism.tensor_parallel_degree=4" ;;
	CP2) echo "2 $s --set parallelism.context_parallel_degree=2" ;;
	PP2-*) echo "2 $s --set parallelism.pipeline_parallel_degree=2 --set parallelism.pipeline_parallel_schedule=${1#PP2-}" ;;
	FSDP2xTP2) echo "4 --set parallelism.data_parallel_shard_degree=2 --set parallelism.tensor_parallel_degree=2" ;;
	FSDP2xPP2) echo "4 --set parallelism.data_parallel_shard_degree=2 --set parallelism.pipeline_parallel_degree=2" ;;
	*) echo "unknown layout $1" >&2; exit 2 ;;
	esac
}
out=bench/plan/results.jsonl
run=$(date -u +%Y%m%dT%H%M%SZ)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$rounds"); do
	for l in "${all[@]}"; do
		read -r n sets <<<"$(sets_of "$l")"
		# shellcheck disable=SC2086
		$bin plan --recipe recipes/llama3_debug.toml --cluster this --world "$n" $sets --json >"$tmp/pred.json"
		d="$tmp/run"
		rm -rf "$d"
		nproc=""
		[ "$n" -gt 1 ] && nproc="--nproc $n"
		load=$(cut -d' ' -f1 /proc/loadavg)
		# shellcheck disable=SC2086
		$bin train --recipe recipes/llama3_debug.toml $nproc $sets --set training.steps="$steps" --set metrics.log_freq=4 \
			--set validation.enable=false --set checkpoint.enable=false --set job.dump_folder="$d" >"$tmp/train.log" 2>&1 ||
			{ echo "$l: titan train failed:" >&2; tail -5 "$tmp/train.log" >&2; continue; }
		$py - "$d/metrics.jsonl" "$tmp/pred.json" "$l" "$n" "$r" "$load" "$run" >>"$out" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
plan = json.load(open(sys.argv[2]))
pred, cal = plan["prediction"], plan["calibration"]
n = int(sys.argv[4])
last = recs[-2:]
tps = sum(x["tokens_per_sec"] for x in last) / len(last) / n
mem = max(x["mem_gib"] for x in recs)
print(json.dumps({"run": sys.argv[7], "layout": sys.argv[3], "nproc": n, "round": int(sys.argv[5]), "load_before": float(sys.argv[6]),
    "measured_tps_per_proc": tps, "measured_mem_gib": mem,
    "predicted_tps_per_proc": pred["tokens_per_sec_per_device"], "predicted_mem_gib": pred["memory_bytes"]["predicted"] / 2**30,
    "memplan_total_gib": pred["memory_bytes"]["memplan_total"] / 2**30, "bubble": pred["bubble_fraction"], "plan_layout": pred["layout"],
    "calibration": cal["source"], "cal_matmul": cal["matmul_efficiency"]}))
PY
		echo "round $r $l done" >&2
	done
done
$py - "$out" "$run" "${all[@]}" <<'PY'
import json, sys, statistics as st
rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("run") == sys.argv[2]]
print(f"run {sys.argv[2]}, load average before each run: " + ", ".join(f"{r['load_before']:.1f}" for r in rows))
print()
# "vs one": the tokens/s error of the layout's ratio to one process,
# each measured ratio taken within a round (the host's speed drifts by
# ±20 % over minutes, which moves every layout of a round alike), the
# median over the rounds; only when "one" is among the layouts.
one = {r["round"]: r for r in rows if r["layout"] == "one"}
print("| layout | procs | predicted tok/s/proc | measured | error | vs one | predicted MiB/proc | measured | error |")
print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
for l in sys.argv[3:]:
    rs = [r for r in rows if r["layout"] == l]
    if not rs:
        continue
    r = rs[-1]
    mt = st.median(x["measured_tps_per_proc"] for x in rs)
    mm = st.median(x["measured_mem_gib"] for x in rs)
    pt, pm = r["predicted_tps_per_proc"], r["predicted_mem_gib"]
    rel = [(x["predicted_tps_per_proc"] / one[x["round"]]["predicted_tps_per_proc"]) /
           (x["measured_tps_per_proc"] / one[x["round"]]["measured_tps_per_proc"]) - 1 for x in rs if x["round"] in one]
    vs = f"{100*st.median(rel):+.1f}%" if rel and l != "one" else "—"
    print(f"| {l} | {r['nproc']} | {pt:.0f} | {mt:.0f} | {100*(pt/mt-1):+.1f}% | {vs} | {1024*pm:.0f} | {1024*mm:.0f} | {100*(pm/mm-1):+.1f}% |")
# The order --search would rank them in: per process count, the layouts
# by predicted tokens/s, with the measured order and the pairs the
# prediction puts the wrong way round (and by how much they measured
# apart).
by = {}
for l in dict.fromkeys(sys.argv[3:]):
    rs = [r for r in rows if r["layout"] == l]
    if rs:
        by.setdefault(rs[-1]["nproc"], []).append((l, rs[-1]["predicted_tps_per_proc"], st.median(x["measured_tps_per_proc"] for x in rs)))
for n, ls in sorted(by.items()):
    if len(ls) < 2:
        continue
    pred = [l for l, _, _ in sorted(ls, key=lambda x: -x[1])]
    meas = [l for l, _, _ in sorted(ls, key=lambda x: -x[2])]
    wrong = [f"{a} over {b} (measured {100*(m[b]/m[a]-1):.1f}% apart)" for m in [{l: v for l, _, v in ls}]
             for i, a in enumerate(pred) for b in pred[i+1:] if m[b] > m[a]]
    print(f"\n{n} processes, predicted order: {' > '.join(pred)}; measured: {' > '.join(meas)}" +
          (f"; inverted: {', '.join(wrong)}" if wrong else "; the same"))
PY
# The run as a plot: each layout's prediction error against its measured
# median, numbered, in bench/plan/this_machine.png.
${GO:-go} run ./bench/plan/plotmeasured -results "$out" -run "$run" -out bench/plan/this_machine.png
