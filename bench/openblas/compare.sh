#!/usr/bin/env bash
# compare.sh times OpenBLAS cblas_sgemm and titan's gemm.Sgemm on the same
# shapes with the same number of threads and prints them side by side.
#
# Usage: bench/openblas/compare.sh [threads] [shape name regexp]
#
# Environment:
#   KERNEL             Go micro-kernel: avx512, avx2 or generic (default:
#                      the one gemm picks on this CPU)
#   SECONDS_PER_SHAPE  timing per shape, library and round (default 1)
#   ROUNDS             rounds per shape, alternating the two libraries
#                      (default 2); the table keeps each side's best
#                      round, which filters out some of the noise of a
#                      shared machine
#
# OPENBLAS_CORETYPE is forced to SkylakeX: the environment's default,
# Haswell, would leave AVX-512 unused.
set -euo pipefail

threads=${1:-2}
filter=${2:-.}
seconds=${SECONDS_PER_SHAPE:-1}
rounds=${ROUNDS:-2}
kernel=${KERNEL:-}
if [ -z "$kernel" ]; then
	# The kernel gemm picks by default on this CPU.
	if grep -qw avx512f /proc/cpuinfo; then
		kernel=avx512
	elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
		kernel=avx2
	else
		kernel=generic
	fi
fi
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

gcc -O2 -o "$tmp/sgemm_bench" "$here/sgemm_bench.c" -lopenblas
(cd "$root" && go test -c -o "$tmp/gemm.test" ./internal/backend/cpu/gemm/)

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$tmp/sgemm_bench" list | grep -E -- "$filter" >"$tmp/shapes.txt" || true
while read -r shape; do
	for ((r = 1; r <= rounds; r++)); do
		OPENBLAS_CORETYPE=SkylakeX OPENBLAS_NUM_THREADS=$threads \
			"$tmp/sgemm_bench" "$seconds" "$shape" >>"$tmp/openblas.txt" 2>"$tmp/openblas.err"
		# Go lines look like:
		# BenchmarkSgemm/avx512/NN_1024x1024x1024-2  10  123 ns/op  280.1 GFLOP/s
		(cd "$root/internal/backend/cpu/gemm" && TITAN_NUM_THREADS=$threads "$tmp/gemm.test" \
			-test.run '^$' -test.bench "^BenchmarkSgemm\$/^${kernel}\$/^${shape}\$" \
			-test.benchtime "${seconds}s") >>"$tmp/go.txt"
	done
done <"$tmp/shapes.txt"
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

head -n 1 "$tmp/openblas.err"
awk -v threads="$threads" -v rounds="$rounds" '
	FNR == NR {
		if (!($1 in blas)) order[++n] = $1
		if ($2 > blas[$1]) blas[$1] = $2
		next
	}
	/GFLOP\/s/ {
		split($1, part, "/")
		name = part[3]
		sub(/-[0-9]+$/, "", name)
		for (i = 1; i <= NF; i++) if ($i == "GFLOP/s") g = $(i - 1)
		kern[name] = part[2]
		if (g > gof[name]) gof[name] = g
	}
	END {
		printf "threads=%s, best of %s rounds, GFLOP/s (higher is better)\n", threads, rounds
		printf "%-26s %10s %10s %8s  %s\n", "shape", "OpenBLAS", "Go", "Go/BLAS", "kernel"
		for (i = 1; i <= n; i++) {
			s = order[i]
			if (!(s in gof)) continue
			printf "%-26s %10.1f %10.1f %8.2f  %s\n", s, blas[s], gof[s], gof[s] / blas[s], kern[s]
		}
	}' "$tmp/openblas.txt" "$tmp/go.txt"
