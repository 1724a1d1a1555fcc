#!/usr/bin/env bash
# gpu-check: the checks of titan's CUDA backend that need an NVIDIA GPU
# (issue 14). One script, about 8 minutes on one GPU:
#
#   1. build titan and the CUDA parity test binary (or use prebuilt ones:
#      bin/titan and bin/cuda-parity.test, for a machine without Go or
#      without the module cache);
#   2. titan devices: the GPU, its clocks and the peak MFU is measured
#      against;
#   3. the parity tests: every kernel, compiled by NVRTC for this GPU, and
#      cuBLASLt, against the CPU backend (float32 and bfloat16 tolerances),
#      then again with the gemm_tiled kernel in place of cuBLASLt;
#   4. titan trains Llama 3.2 1B's shape (configs/llama3.toml "1B") for a
#      few steps on GPU 0 in bfloat16: tokens/s and MFU;
#   5. the PyTorch reference (bench/gpu/torch_llama.py): the same model and
#      batch on the same GPU in eager mode with bfloat16 autocast;
#   6. a summary with the titan/PyTorch ratio;
#   7. titan plan's GPU priors measured with PyTorch on this GPU
#      (bench/plan/gpu_priors.py: attention and float8 rates against the
#      bf16 matmul's, element-wise bandwidth), to check the ratios the
#      planner assumes for the published H100 rows, and one context-
#      parallel rank's ring attention at cp 1-8 (what of the published
#      CP rows' growth one GPU reproduces). On its own:
#      python3 bench/plan/gpu_priors.py (about a minute).
#
# Every step has its own time limit, and a failing step does not stop the
# later ones. Results (logs, JSON, summary.txt) go to $OUT when it is set,
# else to a temporary folder that is printed.
#
# Usage: scripts/gpu-check.sh            (make gpu-check)
#   STEPS=10 BATCH=4 SEQ=2048 to change the training run.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
out="${OUT:-$(mktemp -d /tmp/gpu-check.XXXXXX)}"
mkdir -p "$out"
steps="${STEPS:-10}"
batch="${BATCH:-4}"
seq="${SEQ:-2048}"
py="${PYTHON:-python3}"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start))s; }

note "gpu-check $(git describe --always --dirty 2>/dev/null) on $(hostname), results in $out"

# 1. Build.
if command -v go >/dev/null && timeout 240 go build -o bin/titan ./cmd/titan >"$out/build.log" 2>&1 &&
	timeout 120 go test -c -o bin/cuda-parity.test ./internal/backend/cuda >>"$out/build.log" 2>&1; then
	note "build: ok ($(elapsed))"
elif [ -x bin/titan ] && [ -x bin/cuda-parity.test ]; then
	note "build: failed or no Go here (see build.log); using the prebuilt bin/titan and bin/cuda-parity.test"
else
	note "build: FAILED and no prebuilt binaries (build.log):"
	tail -n 20 "$out/build.log" | tee -a "$summary"
	exit 1
fi

# 2. The device.
timeout 30 bin/titan devices | tee "$out/devices.txt"
peak=$(sed -n 's/.*peak *\([0-9.]*\) TFLOPS bf16.*/\1/p' "$out/devices.txt" | head -n 1)
if grep -q '^no GPU found' "$out/devices.txt"; then
	note "device: $(cat "$out/devices.txt"): nothing to check here"
	exit 1
fi
note "device: $(sed -n 's/^GPU 0: //p' "$out/devices.txt" | head -n 1); bf16 dense peak ${peak:-unknown} TFLOPS"

# 3. Parity, cuBLASLt and then the tiled GEMM kernel.
for mode in gpu gpu-kernels; do
	if TITAN_CUDA_PARITY=$mode timeout 150 bin/cuda-parity.test -test.count=1 -test.v >"$out/parity-$mode.log" 2>&1; then
		note "parity ($mode): ok, $(grep -c '^--- PASS' "$out/parity-$mode.log") tests ($(elapsed))"
	else
		note "parity ($mode): FAILED ($(elapsed)):"
		grep -E '^--- FAIL|^ +[a-z_]+_test\.go:[0-9]+:|^panic' "$out/parity-$mode.log" | head -n 40 | tee -a "$summary"
	fi
	grep 'largest relative difference' "$out/parity-$mode.log" | sed 's/^ *//' >"$out/parity-$mode-figures.txt"
done

# 4. titan trains the 1B model on GPU 0 in bfloat16.
rm -rf "$out/titan-run"
if timeout 180 bin/titan train --recipe recipes/llama3_debug.toml --set model.flavor=1B \
	--set training.device=cuda --set training.mixed_precision_param=bfloat16 \
	--set training.steps="$steps" --set training.local_batch_size="$batch" --set training.seq_len="$seq" \
	--set validation.enable=false --set checkpoint.enable=false --set metrics.log_freq=1 \
	--set lr_scheduler.warmup_steps=2 --set job.dump_folder="$out/titan-run" >"$out/titan-train.log" 2>&1; then
	titan=$("$py" -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
w = [r for r in recs if r.get("step", 0) > 3] or recs
tps = sum(r["tokens_per_sec"] for r in w) / len(w)
mfu = sum(r.get("mfu", 0) for r in w) / len(w)
print(json.dumps({"impl": "titan", "tokens_per_sec": round(tps, 1), "mfu": round(mfu, 4), "loss": recs[-1].get("loss")}))' "$out/titan-run/metrics.jsonl")
	echo "$titan" >"$out/titan.json"
	note "titan train (1B, bf16, batch $batch x $seq, $steps steps): $titan ($(elapsed))"
else
	note "titan train: FAILED ($(elapsed)):"
	tail -n 15 "$out/titan-train.log" | tee -a "$summary"
fi

# 5. PyTorch on the same GPU.
if [ -n "$peak" ] && timeout 150 "$py" bench/gpu/torch_llama.py --peak-tflops "$peak" --steps "$steps" \
	--batch "$batch" --seq "$seq" >"$out/torch.json" 2>"$out/torch.log"; then
	note "pytorch eager: $(cat "$out/torch.json") ($(elapsed))"
else
	note "pytorch: FAILED or no peak ($(elapsed)):"
	tail -n 10 "$out/torch.log" 2>/dev/null | tee -a "$summary"
fi

# 6. Side by side.
if [ -s "$out/titan.json" ] && [ -s "$out/torch.json" ]; then
	"$py" -c '
import json, sys
t, p = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print("titan / pytorch eager: tokens/s %.2fx; MFU titan %.1f%%, pytorch %.1f%% (targets: >= 1x, >= 34%%, goal 45%%)" % (
    t["tokens_per_sec"] / p["tokens_per_sec"], 100 * t["mfu"], 100 * p["mfu"]))' "$out/titan.json" "$out/torch.json" | tee -a "$summary"
fi
# 7. The planner's priors, and one context-parallel rank's ring attention.
if timeout 240 "$py" bench/plan/gpu_priors.py >"$out/plan-priors.json" 2>"$out/plan-priors.log"; then
	"$py" -c '
import json, sys
r = json.load(open(sys.argv[1]))
f = lambda x: "%.2f" % x if x else "not measured"
attn = ", ".join("%s %.2f" % (k, v) for k, v in r.get("attention_rel", {}).items()) or "not measured"
print("titan plan priors on %s: attention/matmul %s (plan 0.60); float8 %s (plan 0.75); a TP8 rank'"'"'s products against the full width'"'"'s: bf16 %s, float8 %s (plan 1.00)" % (
    r["device"], attn, f(r.get("fp8_rel")), f(r.get("matmul_tp8_bf16_rel")), f(r.get("matmul_tp8_fp8_rel"))))
d = r.get("attention_default_backend", {})
flash = [a for a in r.get("attention", []) if isinstance(a, dict) and a["shape"] == d.get("shape")]
if flash and "error" not in d:
    print("CP1 shape %s: SDPA default backend %.0f TFLOP/s fwd+bwd, flash alone %.0f" % (d["shape"], d["forward_backward_flops_per_s"] / 1e12, flash[0]["forward_backward_flops_per_s"] / 1e12))
for k in ("ring", "ring_filled"):
    g = r.get(k, {})
    if "cp" in g:
        print("%s: one rank'"'"'s attention time per block against cp 1 (published: about 1.2x at cp 2, 1.9-2x at cp 4 and 8): %s" % (k,
            ", ".join("cp %s %.2fx (%d allocator retries)" % (c, v["per_block_vs_cp1"], v["alloc_retries"]) for c, v in g["cp"].items())))
if r.get("errors"):
    print("parts that failed: %s (see plan-priors.json)" % ", ".join(r["errors"]))' "$out/plan-priors.json" | tee -a "$summary"
	# The published rows again, under the priors this GPU measured.
	if bin/titan plan --reference --priors "$out/plan-priors.json" >"$out/plan-reference-measured.txt" 2>&1; then
		note "titan plan --reference under these priors: $out/plan-reference-measured.txt"
		head -n 2 "$out/plan-reference-measured.txt" | tee -a "$summary"
		grep -E '^\| [0-9A-Z] \|' "$out/plan-reference-measured.txt" | tee -a "$summary"
	else
		note "titan plan --reference --priors: FAILED:"
		tail -n 3 "$out/plan-reference-measured.txt" | tee -a "$summary"
	fi
else
	note "plan priors: FAILED ($(elapsed)):"
	tail -n 10 "$out/plan-priors.log" 2>/dev/null | tee -a "$summary"
fi
note "gpu-check done in $(elapsed)"
