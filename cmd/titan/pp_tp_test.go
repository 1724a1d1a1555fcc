package main

import (
	"testing"
)

// TestPipelineTensorContextParallelMatchesOneProcess: pipeline parallel
// composed with tensor parallel (sequence and loss parallel), context
// parallel (ring attention) and FSDP, up to 8 processes, under single-
// and multi-stage schedules (zero-bubble ones included, their backward
// split under activation checkpointing too), trains like one process with the
// same global batch of 4 sequences of 32 tokens:
// the same losses within 1e-5 relative at every step and the same
// parameters within 1e-5 (L2 relative) after them, read from rank 0's
// model-only checkpoint of the whole model.
func TestPipelineTensorContextParallelMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	const steps = 10
	data := corpus(t)
	run := func(dump string, extra ...string) {
		t.Helper()
		args := append(tinyRun(dump, data, steps), "--set", "checkpoint.last_save_model_only=true")
		if out, err := titan(t, append(args, extra...)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	one := t.TempDir()
	run(one, "--set", "training.local_batch_size=4")
	for _, c := range []struct {
		name, schedule            string
		batch, shard, cp, tp, mbs int
		ac                        []string // activation_checkpoint keys
	}{
		{"PP2xFSDP2xTP2 1F1B", "1F1B", 2, 2, 1, 2, 1, nil},
		{"PP2xCP2xTP2 Interleaved1F1B", "Interleaved1F1B", 4, 1, 2, 2, 1, nil},
		// The zero-bubble schedules split the backward of recomputed layers.
		{"PP2xCP2xTP2 ZBVZeroBubble full AC", "ZBVZeroBubble", 4, 1, 2, 2, 1, []string{"mode=full"}},
		{"PP2xFSDP2xCP2 InterleavedZeroBubble op AC", "InterleavedZeroBubble", 2, 2, 2, 1, 1, []string{"mode=selective", "selective_ac_option=op"}},
		{"PP2xTP2 GPipe", "GPipe", 4, 1, 1, 2, 2, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			dump := t.TempDir()
			var ac []string
			for _, kv := range c.ac {
				ac = append(ac, "--set", "activation_checkpoint."+kv)
			}
			run(dump, append(ac, "--nproc", itoa(2*c.shard*c.cp*c.tp), "--set", "parallelism.pipeline_parallel_degree=2",
				"--set", "parallelism.data_parallel_shard_degree="+itoa(c.shard),
				"--set", "parallelism.context_parallel_degree="+itoa(c.cp),
				"--set", "parallelism.tensor_parallel_degree="+itoa(c.tp),
				"--set", "training.local_batch_size="+itoa(c.batch),
				"--set", "parallelism.pipeline_parallel_schedule="+c.schedule,
				"--set", "parallelism.pipeline_parallel_microbatch_size="+itoa(c.mbs))...)
			checkParity(t, c.name, one, dump, steps)
		})
	}
}
