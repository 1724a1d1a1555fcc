package main

import "testing"

// TestParityWithoutClipping: with gradient clipping off (max_norm far
// above every gradient norm) each step applies the raw gradient, so a
// layout whose gradient is wrong by any factor moves the parameters
// differently; every parallelism still matches one process in loss,
// grad_norm (every step) and parameters within 1e-5.
func TestParityWithoutClipping(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	const steps = 6
	data := corpus(t)
	run := func(dump string, extra ...string) {
		t.Helper()
		args := append(tinyRun(dump, data, steps), "--set", "checkpoint.last_save_model_only=true", "--set", "training.max_norm=1e9")
		if out, err := titan(t, append(args, extra...)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	one := t.TempDir()
	run(one, "--set", "training.local_batch_size=4")
	for _, c := range []struct {
		name string
		args []string
	}{
		{"FSDP2", []string{"--nproc", "2", "--set", "training.local_batch_size=2"}},
		{"DDP2", []string{"--nproc", "2", "--set", "training.local_batch_size=2", "--set", "parallelism.data_parallel_replicate_degree=2", "--set", "parallelism.data_parallel_shard_degree=1"}},
		{"HSDP2x2", []string{"--nproc", "4", "--set", "training.local_batch_size=1", "--set", "parallelism.data_parallel_replicate_degree=2", "--set", "parallelism.data_parallel_shard_degree=2"}},
		{"TP2", []string{"--nproc", "2", "--set", "training.local_batch_size=4", "--set", "parallelism.tensor_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=1"}},
		{"CP2", []string{"--nproc", "2", "--set", "training.local_batch_size=4", "--set", "parallelism.context_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=1"}},
		{"FSDP2xTP2", []string{"--nproc", "4", "--set", "training.local_batch_size=2", "--set", "parallelism.tensor_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=2"}},
		{"PP2 1F1B", []string{"--nproc", "2", "--set", "training.local_batch_size=4", "--set", "parallelism.pipeline_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=1", "--set", "parallelism.pipeline_parallel_schedule=1F1B", "--set", "parallelism.pipeline_parallel_microbatch_size=1"}},
		{"PP2 ZBVZeroBubble", []string{"--nproc", "2", "--set", "training.local_batch_size=4", "--set", "parallelism.pipeline_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=1", "--set", "parallelism.pipeline_parallel_schedule=ZBVZeroBubble", "--set", "parallelism.pipeline_parallel_microbatch_size=1"}},
		{"PP2xFSDP2", []string{"--nproc", "4", "--set", "training.local_batch_size=2", "--set", "parallelism.pipeline_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=2", "--set", "parallelism.pipeline_parallel_schedule=Interleaved1F1B", "--set", "parallelism.pipeline_parallel_microbatch_size=1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dump := t.TempDir()
			run(dump, c.args...)
			checkParity(t, c.name, one, dump, steps)
		})
	}
}
