#!/bin/bash
# Compares titan's collectives (internal/comm, TCP and shared-memory
# transports) with PyTorch Gloo on this machine: busbw of a float32
# all-reduce (or another op) of SIZE with 2 and 4 local processes, the way
# nccl-tests computes it. Each configuration runs REPEAT times, titan and
# Gloo interleaved so that background load hits both alike; the table shows
# medians and the ratio to Gloo. Raw JSON lines go to $OUT (default
# ${TMPDIR:-/tmp}/titan-gloo-compare.jsonl).
#
# Usage: bench/gloo/compare.sh            (defaults below)
#        SIZE=16MiB NPROCS="2 4" OPS=allreduce REPEAT=3 ITERS=20 WARMUP=5 bench/gloo/compare.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
python="${PYTHON:-/usr/bin/python3}"
size="${SIZE:-64MiB}"
nprocs="${NPROCS:-2 4}"
ops="${OPS:-allreduce}"
repeat="${REPEAT:-3}"
iters="${ITERS:-20}"
warmup="${WARMUP:-5}"
out="${OUT:-${TMPDIR:-/tmp}/titan-gloo-compare.jsonl}"

bin="$(mktemp -d)/commbench"
trap 'rm -rf "$(dirname "${bin}")"' EXIT
(cd "${root}" && go build -o "${bin}" ./internal/comm/cmd/commbench)

: >"${out}"
for op in ${ops}; do
	for n in ${nprocs}; do
		for r in $(seq "${repeat}"); do
			for t in tcp shm; do
				"${bin}" -op "${op}" -size "${size}" -nproc "${n}" -transport "${t}" \
					-iters "${iters}" -warmup "${warmup}" -json |
					sed 's/^{/{"impl":"titan",/' | tee -a "${out}"
			done
			OMP_NUM_THREADS=1 "${python}" "${here}/allreduce.py" --op "${op}" --size "${size}" \
				--nproc "${n}" --iters "${iters}" --warmup "${warmup}" | tee -a "${out}"
		done
	done
done

"${python}" - "${out}" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = {}
for r in rows:
    med.setdefault((r["op"], r["nproc"], r["transport"]), []).append(r["busbw_gbps"])
med = {k: statistics.median(v) for k, v in med.items()}
print()
print(f"{'op':<15}{'size':>10}{'nproc':>6}{'gloo':>10}{'titan tcp':>11}{'ratio':>7}{'titan shm':>11}{'ratio':>7}   (busbw GB/s, medians)")
size = rows[0]["size_bytes"] if rows else 0
for (op, n) in sorted({(k[0], k[1]) for k in med}):
    g = med.get((op, n, "gloo"), float("nan"))
    tcp = med.get((op, n, "tcp"), float("nan"))
    shm = med.get((op, n, "shm"), float("nan"))
    print(f"{op:<15}{size:>10}{n:>6}{g:>10.3f}{tcp:>11.3f}{tcp / g:>7.2f}{shm:>11.3f}{shm / g:>7.2f}")
PY
