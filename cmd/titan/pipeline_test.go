package main

import (
	"strings"
	"testing"
)

// TestPipelineParallelMatchesOneProcess: two pipeline ranks under each
// schedule (and two pipelines of two ranks, replicated or sharded data
// parallel) train
// like one process with the same global batch of 4 sequences: the same
// losses within 1e-5 relative at every one of 10 steps and the same
// parameters within 1e-5 (L2 relative) after them, read from rank 0's
// model-only checkpoint of the whole model.
func TestPipelineParallelMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	const steps = 10
	data := corpus(t)
	run := func(dump string, extra ...string) {
		t.Helper()
		args := append(tinyRun(dump, data, steps), "--set", "checkpoint.last_save_model_only=true")
		out, err := titan(t, append(args, extra...)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	one := t.TempDir()
	run(one, "--set", "training.local_batch_size=4")
	for _, c := range []struct {
		name, schedule               string
		mbs, replicate, shard, batch int
	}{
		{"PP2 GPipe", "GPipe", 2, 1, 1, 4},
		{"PP2 1F1B", "1F1B", 1, 1, 1, 4},
		{"PP2 Interleaved1F1B", "Interleaved1F1B", 1, 1, 1, 4},
		{"PP2 InterleavedZeroBubble", "InterleavedZeroBubble", 1, 1, 1, 4},
		{"PP2 ZBVZeroBubble", "ZBVZeroBubble", 1, 1, 1, 4},
		{"PP2xDDP2 1F1B", "1F1B", 1, 2, 1, 2},
		{"PP2xFSDP2 Interleaved1F1B", "Interleaved1F1B", 1, 1, 2, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			dump := t.TempDir()
			run(dump, "--nproc", itoa(2*c.replicate*c.shard), "--set", "parallelism.pipeline_parallel_degree=2",
				"--set", "parallelism.data_parallel_replicate_degree="+itoa(c.replicate), "--set", "parallelism.data_parallel_shard_degree="+itoa(c.shard),
				"--set", "training.local_batch_size="+itoa(c.batch),
				"--set", "parallelism.pipeline_parallel_schedule="+c.schedule,
				"--set", "parallelism.pipeline_parallel_microbatch_size="+itoa(c.mbs))
			checkParity(t, c.name, one, dump, steps)
		})
	}
}

// TestPipelineParallelRefusesBadLayouts: layers that do not divide into
// the stages and a multi-stage schedule with one stage per rank are
// refused with a message that says why.
func TestPipelineParallelRefusesBadLayouts(t *testing.T) {
	data := corpus(t)
	for _, c := range []struct {
		name string
		set  []string
		want string
	}{
		{"layers not divisible", []string{"parallelism.pipeline_parallel_schedule=Interleaved1F1B", "model.flavor=debug"}, "n_layers 6 is not divisible by 4 stages (pp 2 × 2 virtual)"},
		{"layers per stage", []string{"parallelism.pipeline_parallel_layers_per_stage=3"}, "n_layers 4 is not divisible"},
		{"virtual 1", []string{"parallelism.pipeline_parallel_schedule=Interleaved1F1B", "parallelism.pipeline_parallel_layers_per_stage=2"}, "needs virtual >= 2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append(tinyRun(t.TempDir(), data, 2), "--nproc", "2", "--set", "parallelism.pipeline_parallel_degree=2")
			for _, s := range c.set {
				args = append(args, "--set", s)
			}
			out, err := titan(t, args...)
			if err == nil || !strings.Contains(err.Error()+out, c.want) {
				t.Fatalf("got %v\n%s\nwant an error containing %q", err, out, c.want)
			}
		})
	}
}

// TestPipelineCheckpointResumes: a full checkpoint written under PP2
// Interleaved1F1B (whole tensors, gathered on rank 0) resumes under PP2
// ZBV, with other stage boundaries, under PP2×FSDP2 1F1B, each rank
// loading its chunk of its stage, under PP2×CP2×TP2 1F1B with selective
// activation checkpointing of every second layer, each rank loading its
// tp shards of its stage, and under one process, and all
// continue like the uninterrupted run.
func TestPipelineCheckpointResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	data := corpus(t)
	pp := func(schedule string) []string {
		return []string{"--nproc", "2", "--set", "parallelism.pipeline_parallel_degree=2", "--set", "parallelism.pipeline_parallel_schedule=" + schedule,
			"--set", "training.local_batch_size=4", "--set", "lr_scheduler.total_steps=6"}
	}
	whole := t.TempDir()
	if out, err := titan(t, append(tinyRun(whole, data, 6), pp("Interleaved1F1B")...)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	half := t.TempDir()
	if out, err := titan(t, append(tinyRun(half, data, 4), pp("Interleaved1F1B")...)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"PP2 ZBV", pp("ZBVZeroBubble")},
		{"PP2xFSDP2 1F1B", append(pp("1F1B"), "--nproc", "4", "--set", "parallelism.data_parallel_shard_degree=2", "--set", "training.local_batch_size=2")},
		{"PP2xCP2xTP2 1F1B AC selective 2", append(pp("1F1B"), "--nproc", "8", "--set", "parallelism.context_parallel_degree=2", "--set", "parallelism.tensor_parallel_degree=2",
			"--set", "activation_checkpoint.mode=selective", "--set", "activation_checkpoint.selective_ac_option=2")},
		{"one process", []string{"--set", "training.local_batch_size=4", "--set", "lr_scheduler.total_steps=6"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkResume(t, c.name, "PP2", whole, half, data, c.args)
		})
	}
}
