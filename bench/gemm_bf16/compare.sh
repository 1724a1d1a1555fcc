#!/usr/bin/env bash
# The bf16 GEMM against titan's float32 GEMM and PyTorch 1.13's float32
# and bfloat16 matmul, side by side in one run, on the linear-layer
# shapes of the tiny_bench and debug models (2048 tokens; forward NT,
# backward NN and TN; internal/backend/cpu/gemm/bf16_bench_test.go) with
# 1 and 2 threads.
#
# titan: BenchmarkLinear (f32: Sgemm; bf16: GemmBF16 on bfloat16
# operands; bf16f32: GemmBF16 on float32 operands rounded while packing).
# PyTorch: matmul.py, with OMP_WAIT_POLICY=PASSIVE, OMP_NUM_THREADS and
# torch.set_num_threads equal to the thread count and OPENBLAS_CORETYPE
# unset, as bench/pytorch/best.sh runs it. The two alternate ROUNDS times
# and the table keeps each side's best round, which filters out some of
# the noise of a shared machine.
#
# Usage: bench/gemm_bf16/compare.sh [shape name regexp]
#
# Environment: ROUNDS (default 2), SECONDS_PER_SHAPE (default 0.5).
set -euo pipefail
filter=${1:-.}
rounds=${ROUNDS:-2}
seconds=${SECONDS_PER_SHAPE:-0.5}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-/usr/bin/python3}

# PyTorch's float32 matmul goes to the system BLAS: the comparison means
# nothing with the reference BLAS.
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)
case "$blas" in
*openblas*) ;;
*)
	echo "compare.sh: libblas.so.3 is ${blas:-missing}, not OpenBLAS: PyTorch's float32 matmul would not be its best" >&2
	exit 1
	;;
esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$root" && go test -c -o "$tmp/gemm.test" ./internal/backend/cpu/gemm/)
(cd "$root/internal/backend/cpu/gemm" && TITAN_PRINT_SHAPES=1 "$tmp/gemm.test" -test.run '^TestPrintLinearShapes$') |
	grep -E '^[NT][NT]_' | grep -E -- "$filter" >"$tmp/shapes.txt" || true
if [ ! -s "$tmp/shapes.txt" ]; then
	echo "compare.sh: no shape matches $filter" >&2
	exit 1
fi
names=$(cut -d' ' -f1 "$tmp/shapes.txt" | paste -sd'|')

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= rounds; r++)); do
	# Go lines: BenchmarkLinear/threads=1/bf16/NT_2048x256x256-2  N  ns/op  G GFLOP/s
	(cd "$root/internal/backend/cpu/gemm" && "$tmp/gemm.test" -test.run '^$' \
		-test.bench "^BenchmarkLinear\$/^threads=[12]\$/^(f32|bf16|bf16f32)\$/^(${names})\$" \
		-test.benchtime "${seconds}s") |
		awk '/GFLOP\/s/ { n = $1; sub(/^BenchmarkLinear\//, "", n); sub(/-[0-9]+$/, "", n); print "titan", n, $(NF-1) }' >>"$tmp/all.txt"
	for t in 1 2; do
		env -u OPENBLAS_CORETYPE OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS="$t" MKL_NUM_THREADS="$t" \
			"$py" "$here/matmul.py" --threads "$t" --seconds "$seconds" <"$tmp/shapes.txt" |
			awk '{ print "torch", $1, $2 }' >>"$tmp/all.txt"
	done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

"$py" - "$tmp/shapes.txt" "$tmp/all.txt" "$rounds" <<'PY'
import sys
shapes = [l.split()[0] for l in open(sys.argv[1]) if l.strip()]
best = {}
for line in open(sys.argv[2]):
    impl, key, g = line.split()
    threads, kind, name = key.split("/")
    k = (impl, threads, kind, name)
    best[k] = max(best.get(k, 0.0), float(g))
print(f"GFLOP/s, best of {sys.argv[3]} rounds (higher is better); titan bf16 = GemmBF16 on bfloat16 operands, "
      "bf16←f32 on float32 operands rounded while packing; torch bf16 = bfloat16 in and out (oneDNN)")
hdr = f"{'shape':<24} {'thr':>3} {'titan f32':>9} {'titan bf16':>10} {'bf16←f32':>8} {'bf16/f32':>8} {'torch f32':>9} {'torch bf16':>10} {'bf16 titan/torch':>16}"
print(hdr)
ratios = {}
for threads in ("threads=1", "threads=2"):
    for s in shapes:
        f = best.get(("titan", threads, "f32", s), 0)
        b = best.get(("titan", threads, "bf16", s), 0)
        bf = best.get(("titan", threads, "bf16f32", s), 0)
        tf = best.get(("torch", threads, "f32", s), 0)
        tb = best.get(("torch", threads, "bf16", s), 0)
        r1 = b / f if f else 0
        r2 = b / tb if tb else 0
        ratios.setdefault(threads, []).append((r1, r2))
        print(f"{s:<24} {threads[8:]:>3} {f:9.1f} {b:10.1f} {bf:8.1f} {r1:8.2f} {tf:9.1f} {tb:10.1f} {r2:16.2f}")
for threads, rs in ratios.items():
    import math
    g1 = math.exp(sum(math.log(r[0]) for r in rs if r[0] > 0) / len(rs))
    g2 = math.exp(sum(math.log(r[1]) for r in rs if r[1] > 0) / len(rs))
    print(f"{threads}: geometric mean bf16/f32 {g1:.2f}, titan bf16 / torch bf16 {g2:.2f}")
PY
