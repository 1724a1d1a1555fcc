#!/usr/bin/env bash
# Training-step throughput of titan against PyTorch 1.13 on the same model,
# side by side in one run: recipes/llama3_tiny_bench.toml (dim 256, 4 layers,
# 4 heads, FFN 768, vocab 2000, seq 256, batch 8, AdamW, float32).
#
# titan: `titan train --recipe recipes/llama3_tiny_bench.toml` for STEPS
# steps, logging every 5; the tokens/s of the windows after the first 5
# steps are averaged (the first window holds start-up). PyTorch: its best
# thread setting (bench/pytorch/best.sh). The two alternate ROUNDS times so
# that machine noise hits both.
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
for r in $(seq "$rounds"); do
	rm -rf "$out/run"
	./bin/titan train --recipe recipes/llama3_tiny_bench.toml --set training.steps="$steps" \
		--set metrics.log_freq=5 --set job.dump_folder="$out/run" > "$out/titan.log"
	titan_tps=$($py -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
w = [r["tokens_per_sec"] for r in recs if r["step"] > 5]
print(round(sum(w) / len(w), 1))' "$out/run/metrics.jsonl")
	torch_tps=$(bash bench/pytorch/best.sh --steps 10 | tail -n 1 | $py -c 'import json,sys; print(json.load(sys.stdin)["best_tokens_per_sec"])')
	ratio=$($py -c "print(round($titan_tps / $torch_tps, 2))")
	printf 'round %d: titan %s tokens/s, pytorch (best threads) %s tokens/s, ratio %s\n' "$r" "$titan_tps" "$torch_tps" "$ratio"
done
