#!/usr/bin/env bash
# Loss curves of the debug model (recipes/llama3_debug.toml) trained for
# STEPS steps in float32, in bfloat16 mixed precision and with float8
# linear layers under each scaling recipe (bfloat16 elsewhere, as
# torchtitan runs float8), overlaid in one plot (titan plot, from the run
# store), with a second plot of each loss relative to float32's at the
# same step (OUT's folder, loss_vs_float32.png), and each final loss
# against float32's: the must-show of issue 12 is every ratio within 2%.
#
# The per-step losses go to OUT.png's folder as losses.csv (one column per
# run) and the final-loss summary as summary.txt.
#
# Usage: bench/mixed/curves.sh [STEPS] [OUT.png]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps="${1:-300}"
png="${2:-bench/mixed/loss_curves.png}"
py=/usr/bin/python3
make -s build
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
db="$out/runs.db"
ids=()
names=(float32 bfloat16 float8_tensorwise float8_rowwise float8_rowwise_with_gw_hp)
for name in "${names[@]}"; do
	args=(--set training.steps="$steps" --set metrics.log_freq=10 --set checkpoint.enable=false
		--set validation.enable=false --set metrics.enable_db=true --set metrics.db="$db"
		--set job.dump_folder="$out/$name" --set job.description="$name")
	case "$name" in
	float32) ;;
	bfloat16) args+=(--set training.mixed_precision_param=bfloat16) ;;
	float8_*) args+=(--set training.mixed_precision_param=bfloat16 --set 'model.converters=["float8"]'
		--set float8.recipe_name="${name#float8_}") ;;
	esac
	./bin/titan train --recipe recipes/llama3_debug.toml "${args[@]}" > "$out/$name.log" 2>&1
	id=$(sed -n 's/^titan: run \([^,]*\), recorded in.*/\1/p' "$out/$name.log" | head -n 1)
	ids+=("$id")
	$py - "$out/$name/metrics.jsonl" "$name" "$id" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
last = recs[-1]
print(f"{sys.argv[2]:28s} run {sys.argv[3]}  step {last['step']}  final loss {last['loss']:.4f}  tokens/s {last['tokens_per_sec']:.0f}")
PY
done | tee "$out/summary.txt"
$py - "$out" "$(dirname "$png")" "${names[@]}" <<'PY' | tee -a "$out/summary.txt"
import json, sys
out, dest, names = sys.argv[1], sys.argv[2], sys.argv[3:]
final, loss = {}, {}
for n in names:
    recs = [json.loads(l) for l in open(f"{out}/{n}/metrics.jsonl") if '"loss"' in l]
    final[n] = recs[-1]["loss"]
    loss[n] = {r["step"]: r["loss"] for r in recs}
with open(f"{dest}/losses.csv", "w") as f:
    f.write("step," + ",".join(names) + "\n")
    for s in sorted(loss["float32"]):
        f.write(f"{s}," + ",".join(f"{loss[n].get(s, float('nan')):.6f}" for n in names) + "\n")
ref = final["float32"]
for n in names[1:]:
    r = final[n] / ref - 1
    print(f"{n:28s} final loss {final[n]:.4f} vs float32 {ref:.4f}: {100*r:+.2f}% {'(within 2%)' if abs(r) <= 0.02 else '(OUTSIDE 2%)'}")
PY
cp "$out/summary.txt" "$(dirname "$png")/summary.txt"
ids=($(sed -n 's/.* run \([^ ]*\) .*/\1/p' "$out/summary.txt"))
./bin/titan plot "${ids[@]}" --db "$db" --metric loss --out "$png"
# The curves lie on top of each other at this scale: the second plot draws
# each run's loss relative to float32's at the same step, in percent.
./bin/titan plot "${ids[@]:1}" --relative-to "${ids[0]}" --db "$db" --metric loss --smooth 0.7 \
	--out "$(dirname "$png")/loss_vs_float32.png"
