package main

import (
	"math"
	"strings"
	"testing"
)

// TestTensorContextParallelMatchesOneProcess: tensor parallel (with
// sequence and loss parallel), context parallel (ring attention with
// head/tail chunks) and their compositions with each other and with FSDP
// train like one process with the same global batch of 4 sequences of 32
// tokens: the same losses within 1e-5 relative at every one of 10 steps
// and the same parameters within 1e-5 (L2 relative) after them; so do
// TP2×CP2 with full activation checkpointing and TP2 with selective
// checkpointing of every second layer.
func TestTensorContextParallelMatchesOneProcess(t *testing.T) {
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
	refState := metricsColumn(t, one, "state_gib")
	for _, c := range []struct {
		name                  string
		nproc, batch          int
		tp, cp, shard, replic int
		extra                 []string
	}{
		{"TP2", 2, 4, 2, 1, 1, 1, nil},
		{"CP2", 2, 4, 1, 2, 1, 1, nil},
		{"TP2xCP2", 4, 4, 2, 2, 1, 1, nil},
		{"FSDP2xTP2", 4, 2, 2, 1, 2, 1, nil},
		{"CP2xFSDP2", 4, 2, 1, 2, 2, 1, nil},
		{"DDP2xTP2", 4, 2, 2, 1, 1, 2, nil},
		{"TP2xCP2 AC full", 4, 4, 2, 2, 1, 1, []string{"--set", "activation_checkpoint.mode=full"}},
		{"TP2 AC selective 2", 2, 4, 2, 1, 1, 1, []string{"--set", "activation_checkpoint.mode=selective", "--set", "activation_checkpoint.selective_ac_option=2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dump := t.TempDir()
			args := []string{"--nproc", itoa(c.nproc), "--set", "training.local_batch_size=" + itoa(c.batch),
				"--set", "parallelism.tensor_parallel_degree=" + itoa(c.tp),
				"--set", "parallelism.context_parallel_degree=" + itoa(c.cp),
				"--set", "parallelism.data_parallel_shard_degree=" + itoa(c.shard),
				"--set", "parallelism.data_parallel_replicate_degree=" + itoa(c.replic)}
			run(dump, append(args, c.extra...)...)
			checkParity(t, c.name, one, dump, steps)
			// Parameters, gradients and optimizer state shrink by tp
			// and by the FSDP shard group dp_shard × cp (torchtitan's
			// dp_shard_cp mesh: cp alone shards too).
			want := float64(c.tp * c.shard * c.cp)
			state := metricsColumn(t, dump, "state_gib")[1]
			if ratio := state / refState[1] * want; math.Abs(ratio-1) > 0.1 {
				t.Errorf("state per worker %.6f GiB, one process %.6f GiB: %.3f × the 1/%g share, want within 10%%", state, refState[1], ratio, want)
			}
			t.Logf("%s: state %.6f GiB per worker, %.4f of one process (ideal 1/%g)", c.name, state, state/refState[1], want)
			if c.shard*c.cp > 1 {
				if g := metricsColumn(t, dump, "gathered_units")[steps]; g > 2 {
					t.Errorf("%v gathered units alive at once, want at most 2 (the unit computing and the one prefetched)", g)
				}
			}
		})
	}
}

// TestTensorContextParallelRefusals: layouts whose shapes do not split
// are refused with the reason.
func TestTensorContextParallelRefusals(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process runs")
	}
	data := corpus(t)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"heads", []string{"--nproc", "3", "--set", "parallelism.tensor_parallel_degree=3"},
			"parallelism.tensor_parallel_degree 3: n_heads 4 is not divisible by 3"},
		{"sequence", []string{"--nproc", "3", "--set", "parallelism.context_parallel_degree=3"},
			"parallelism.context_parallel_degree 3: sequence length 32 does not split into 2×3 = 6 equal chunks"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := titan(t, append(tinyRun(t.TempDir(), data, 1), c.args...)...)
			if err == nil {
				t.Fatalf("ran; want the error %q", c.want)
			}
			if msg := err.Error() + out; !strings.Contains(msg, c.want) {
				t.Errorf("error %v\n%s\nwant it to say %q", err, out, c.want)
			}
		})
	}
}

// TestTensorParallelCheckpointReshards: a full checkpoint written under
// FSDP2×TP2 (whole tensors, with the optimizer moments) resumes under one
// process and under TP2×CP2, each loading its own shards, and both
// continue like the uninterrupted FSDP2×TP2 run.
func TestTensorParallelCheckpointReshards(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	data := corpus(t)
	ft := []string{"--nproc", "4", "--set", "training.local_batch_size=2", "--set", "parallelism.data_parallel_shard_degree=2",
		"--set", "parallelism.tensor_parallel_degree=2", "--set", "lr_scheduler.total_steps=6"}
	whole := t.TempDir()
	if out, err := titan(t, append(tinyRun(whole, data, 6), ft...)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	half := t.TempDir()
	if out, err := titan(t, append(tinyRun(half, data, 4), ft...)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"one process", []string{"--set", "training.local_batch_size=4"}},
		{"TP2xCP2", []string{"--nproc", "4", "--set", "training.local_batch_size=4",
			"--set", "parallelism.tensor_parallel_degree=2", "--set", "parallelism.context_parallel_degree=2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkResume(t, c.name, "FSDP2×TP2", whole, half, data, append(c.args, "--set", "lr_scheduler.total_steps=6"))
		})
	}
}
