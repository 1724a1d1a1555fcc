#!/usr/bin/env bash
# Profiles one PP2×FSDP2 step of the tiny_bench Llama on 4 processes and
# copies the merged trace, its summary table and titan's timeline picture
# here (pp2_fsdp2_timeline.png, pp2_fsdp2_summary.txt). Open trace.json in
# ui.perfetto.dev or chrome://tracing for the interactive view.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/local/go/bin:$PATH
dump=$(mktemp -d)
go build -o "$dump/titan" ./cmd/titan
"$dump/titan" train --recipe recipes/llama3_debug.toml --nproc 4 \
	--set model.flavor=tiny_bench --set training.seq_len=64 --set training.local_batch_size=4 --set training.steps=4 \
	--set parallelism.pipeline_parallel_degree=2 --set parallelism.data_parallel_shard_degree=2 \
	--set parallelism.pipeline_parallel_microbatch_size=1 --set checkpoint.enable=false --set metrics.enable_db=false \
	--set profiling.enable_profiling=true --set profiling.save_traces_folder=prof --set profiling.profile_freq=4 \
	--set profiling.profiler_warmup=1 --set profiling.profiler_active=2 --set job.dump_folder="$dump"
it="$dump/prof/iteration_4"
cp "$it/timeline.png" bench/trace/pp2_fsdp2_timeline.png
cp "$it/summary.txt" bench/trace/pp2_fsdp2_summary.txt
echo "trace: $it/trace.json"
