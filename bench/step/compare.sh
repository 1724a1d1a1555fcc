#!/usr/bin/env bash
# Training-step throughput of titan against PyTorch 1.13 on the same model,
# side by side in one run: recipes/llama3_tiny_bench.toml (dim 256, 4 layers,
# 4 heads, FFN 768, vocab 2000, seq 256, batch 8, AdamW), in float32 and in
# bfloat16 mixed precision.
#
# titan: `titan train --recipe recipes/llama3_tiny_bench.toml` for STEPS
# steps, logging every 5, with training.mixed_precision_param float32 and
# bfloat16; the tokens/s of the windows after the first 5 steps are
# averaged (the first window holds start-up). PyTorch: its best thread
# setting (bench/pytorch/best.sh), in float32 and under bfloat16 autocast
# (train_step.py --autocast bfloat16). The four alternate ROUNDS times so
# that machine noise hits all of them.
#
# Usage: bench/step/compare.sh [ROUNDS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${1:-2}"
steps="${2:-25}"
py=/usr/bin/python3
make -s build
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
titan_tps() {
	rm -rf "$out/run"
	./bin/titan train --recipe recipes/llama3_tiny_bench.toml --set training.steps="$steps" \
		--set metrics.log_freq=5 --set job.dump_folder="$out/run" \
		--set training.mixed_precision_param="$1" > "$out/titan.log"
	$py -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
w = [r["tokens_per_sec"] for r in recs if r["step"] > 5]
print(round(sum(w) / len(w), 1))' "$out/run/metrics.jsonl"
}
torch_tps() {
	bash bench/pytorch/best.sh --steps 10 "$@" | tail -n 1 | $py -c 'import json,sys; print(json.load(sys.stdin)["best_tokens_per_sec"])'
}
for r in $(seq "$rounds"); do
	t32=$(titan_tps float32)
	t16=$(titan_tps bfloat16)
	p32=$(torch_tps)
	p16=$(torch_tps --autocast bfloat16)
	$py - "$r" "$t32" "$t16" "$p32" "$p16" <<'PY'
import sys
r, t32, t16, p32, p16 = sys.argv[1], *map(float, sys.argv[2:])
best = max(p32, p16)
print(f"round {r}: titan float32 {t32:.0f} tokens/s, titan bfloat16 {t16:.0f} tokens/s "
      f"({t16 / t32:.2f}x titan float32); pytorch (best threads) float32 {p32:.0f}, bfloat16 autocast {p16:.0f}; "
      f"titan bfloat16 / pytorch best {t16 / best:.2f}x, titan float32 / pytorch float32 {t32 / p32:.2f}x")
PY
done
