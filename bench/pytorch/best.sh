#!/bin/bash
# Runs the PyTorch peer benchmark (train_step.py) under each thread
# configuration that is worth trying on a small CPU machine and reports the
# best one.
#
# For torch threads T in {1, 2} and OpenBLAS threads O in {1, 2}:
#   - OMP_WAIT_POLICY=PASSIVE so idle OpenMP workers do not spin,
#   - OPENBLAS_CORETYPE is unset (a forced Haswell core type halves the
#     speed of OpenBLAS kernels on this machine),
#   - OMP_NUM_THREADS and MKL_NUM_THREADS equal T.
# Each configuration prints its JSON line; the last line is
#   {"impl":"pytorch","best_tokens_per_sec":...,"config":"..."}.
# Extra arguments are passed to train_step.py (e.g. --steps 20).
#
# Usage: bench/pytorch/best.sh [train_step.py flags]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-/usr/bin/python3}"

best_tps=0
best_cfg=""
for t in 1 2; do
	for o in 1 2; do
		cfg="torch_threads=${t} OPENBLAS_NUM_THREADS=${o}"
		line="$(env -u OPENBLAS_CORETYPE \
			OMP_WAIT_POLICY=PASSIVE \
			OMP_NUM_THREADS="${t}" MKL_NUM_THREADS="${t}" \
			OPENBLAS_NUM_THREADS="${o}" \
			"${python}" "${here}/train_step.py" --threads "${t}" "$@" | tail -n 1)"
		tps="$("${python}" -c 'import json,sys; print(json.loads(sys.argv[1])["tokens_per_sec"])' "${line}")"
		echo "${cfg}: ${tps} tokens/s  ${line}"
		if "${python}" -c 'import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)' "${tps}" "${best_tps}"; then
			best_tps="${tps}"
			best_cfg="${cfg}"
		fi
	done
done
printf '{"impl":"pytorch","best_tokens_per_sec":%s,"config":"%s"}\n' "${best_tps}" "${best_cfg}"
