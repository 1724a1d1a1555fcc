package main

import (
	"math"
	"strings"
	"testing"
)

// mixedTol is the agreement of bfloat16 training across layouts. The
// bfloat16 rounding is element-wise, so every layout computes with the
// same bfloat16 parameters as long as the float32 masters agree; but the
// gradients are float32 sums in a layout's order (over ranks, over
// microbatches), so the masters differ in their last bits after the
// first update, and a master within a float32 rounding of a bfloat16 tie
// may round to the other neighbour: one element moves by a bfloat16 ulp
// (2^-8 relative). Such flips are rare (about 1e-7 / 2^-8 of the
// elements per step) and their effect on the loss is diluted over the
// model. The logits are bfloat16 too (as PyTorch's output layer writes
// them): a layout's last-bit differences in a logit flip its rounding as
// rarely, but a loss reads every one of the N×V logits, so the losses
// and gradient norms spread about three times as far as the parameters
// suggest. Measured over 10 steps of tiny_bench (FSDP2, TP2, PP2): loss
// 1.7e-4, gradient norm 6.5e-4, parameters 1.1e-5 relative (3.7e-5,
// 3.0e-4 and 1.4e-5 with float32 logits); the tolerances leave a factor
// of 3 to 9 over that, and stay below the bfloat16 against float32
// difference (2.6e-3).
var mixedTol = parityTol{loss: 5e-4, gradNorm: 2e-3, params: 1e-4}

// TestMixedPrecisionLayoutsMatchOneProcess: bfloat16 mixed precision
// trains under FSDP2, TP2, PP2 and CP2 like one bfloat16 process within
// mixedTol; bfloat16 differs from float32 (the key is honoured) by less
// than 2%; a bfloat16 gradient reduction (training.mixed_precision_reduce)
// changes the FSDP2 run and stays within 1% of the float32 reduction.
func TestMixedPrecisionLayoutsMatchOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	const steps = 10
	data := corpus(t)
	run := func(dump string, extra ...string) {
		t.Helper()
		args := append(tinyRun(dump, data, steps), "--set", "checkpoint.last_save_model_only=true",
			"--set", "training.mixed_precision_param=bfloat16")
		if out, err := titan(t, append(args, extra...)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	one := t.TempDir()
	run(one, "--set", "training.local_batch_size=4")
	f32 := t.TempDir()
	run(f32, "--set", "training.local_batch_size=4", "--set", "training.mixed_precision_param=float32")
	ref, other := metricsColumn(t, one, "loss"), metricsColumn(t, f32, "loss")
	worst := 0.0
	for step := 1; step <= steps; step++ {
		d := math.Abs(ref[step]-other[step]) / other[step]
		worst = max(worst, d)
		if d > 0.02 {
			t.Errorf("step %d: loss %.6g in bfloat16, %.6g in float32: more than 2%% apart", step, ref[step], other[step])
		}
	}
	if worst < 1e-5 {
		t.Errorf("bfloat16 losses within %.3g of float32's: mixed_precision_param changed nothing", worst)
	}
	t.Logf("bfloat16 against float32: worst loss difference %.3g relative", worst)

	fsdp := []string{"--nproc", "2", "--set", "training.local_batch_size=2", "--set", "parallelism.data_parallel_shard_degree=2"}
	fsdpDump := t.TempDir()
	for _, c := range []struct {
		name string
		args []string
	}{
		{"FSDP2", fsdp},
		{"TP2", []string{"--nproc", "2", "--set", "parallelism.tensor_parallel_degree=2"}},
		{"PP2", []string{"--nproc", "2", "--set", "parallelism.pipeline_parallel_degree=2",
			"--set", "parallelism.pipeline_parallel_schedule=1F1B", "--set", "parallelism.pipeline_parallel_microbatch_size=1"}},
		{"CP2", []string{"--nproc", "2", "--set", "parallelism.context_parallel_degree=2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dump := t.TempDir()
			if c.name == "FSDP2" {
				dump = fsdpDump // kept for the reduction test below
			}
			run(dump, append([]string{"--set", "training.local_batch_size=4"}, c.args...)...)
			checkParityWithin(t, c.name+" bfloat16", one, dump, steps, mixedTol)
		})
	}
	t.Run("FSDP2 reduce bfloat16", func(t *testing.T) {
		dump := t.TempDir()
		run(dump, append(fsdp, "--set", "training.mixed_precision_reduce=bfloat16")...)
		want, got := metricsColumn(t, fsdpDump, "loss"), metricsColumn(t, dump, "loss")
		worst := 0.0
		for step := 1; step <= steps; step++ {
			d := math.Abs(got[step]-want[step]) / want[step]
			worst = max(worst, d)
			if d > 0.01 {
				t.Errorf("step %d: loss %.6g with bfloat16 reductions, %.6g with float32: more than 1%% apart", step, got[step], want[step])
			}
		}
		if worst == 0 {
			t.Error("bfloat16 reductions gave the float32 reductions' losses: mixed_precision_reduce changed nothing")
		}
		t.Logf("bfloat16 against float32 gradient reductions: worst loss difference %.3g relative", worst)
	})
}

// TestFloat8Trains: model.converters = ["float8"] trains tiny_bench with
// each recipe (bfloat16 elsewhere) within 2% of bfloat16 training, each
// recipe to its own losses; a filter_fqns that names every block linear
// (the output is filtered by default) gives the bfloat16 losses bit for
// bit; float8 trains under FSDP2; a hyena model refuses both keys.
func TestFloat8Trains(t *testing.T) {
	if testing.Short() {
		t.Skip("training runs")
	}
	const steps = 4
	data := corpus(t)
	run := func(extra ...string) map[int]float64 {
		t.Helper()
		dump := t.TempDir()
		args := append(tinyRun(dump, data, steps), "--set", "checkpoint.enable=false",
			"--set", "training.mixed_precision_param=bfloat16")
		if out, err := titan(t, append(args, extra...)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return metricsColumn(t, dump, "loss")
	}
	f8 := func(recipe string, extra ...string) []string {
		return append([]string{"--set", `model.converters=["float8"]`, "--set", "float8.recipe_name=" + recipe}, extra...)
	}
	bf16 := run()
	seen := map[float64]string{bf16[steps]: "bfloat16"}
	for _, recipe := range []string{"tensorwise", "rowwise", "rowwise_with_gw_hp"} {
		got := run(f8(recipe)...)
		for step := 1; step <= steps; step++ {
			if d := math.Abs(got[step]-bf16[step]) / bf16[step]; d > 0.02 {
				t.Errorf("%s step %d: loss %.6g, bfloat16 %.6g: more than 2%% apart", recipe, step, got[step], bf16[step])
			}
		}
		if other, ok := seen[got[steps]]; ok {
			t.Errorf("%s: final loss %.9g, the same as %s's", recipe, got[steps], other)
		}
		seen[got[steps]] = recipe
		t.Logf("%s: final loss %.6g, bfloat16 %.6g", recipe, got[steps], bf16[steps])
	}
	filtered := run(f8("rowwise", "--set", `float8.filter_fqns=["attention", "feed_forward", "output"]`)...)
	for step := 1; step <= steps; step++ {
		if filtered[step] != bf16[step] {
			t.Errorf("every linear filtered, step %d: loss %.9g, bfloat16 %.9g", step, filtered[step], bf16[step])
		}
	}
	fsdp := run(f8("tensorwise", "--nproc", "2", "--set", "parallelism.data_parallel_shard_degree=2", "--set", "training.local_batch_size=1")...)
	if d := math.Abs(fsdp[steps]-bf16[steps]) / bf16[steps]; d > 0.02 {
		t.Errorf("float8 under FSDP2: final loss %.6g, bfloat16 %.6g", fsdp[steps], bf16[steps])
	}
	for _, c := range []struct{ set, key string }{
		{"training.mixed_precision_param=bfloat16", "training.mixed_precision_param"},
		{`model.converters=["float8"]`, "model.converters"},
	} {
		out, err := titan(t, "train", "--recipe", "../../recipes/hyena_debug.toml", "--set", "training.steps=1",
			"--set", "job.dump_folder="+t.TempDir(), "--set", c.set)
		if err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("hyena with %s: error %v, want one naming %s\n%s", c.set, err, c.key, out)
		}
	}
}

// TestMixedPrecisionResumes: checkpoints keep the float32 masters, so a
// bfloat16 FSDP2 run interrupted after 4 steps resumes like the
// uninterrupted one (the bfloat16 copies are derived again from the
// loaded masters).
func TestMixedPrecisionResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	data := corpus(t)
	args := []string{"--nproc", "2", "--set", "training.local_batch_size=1", "--set", "lr_scheduler.total_steps=6",
		"--set", "parallelism.data_parallel_shard_degree=2", "--set", "training.mixed_precision_param=bfloat16"}
	whole, half := t.TempDir(), t.TempDir()
	for _, r := range []struct {
		dump  string
		steps int
	}{{whole, 6}, {half, 4}} {
		if out, err := titan(t, append(tinyRun(r.dump, data, r.steps), args...)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	checkResume(t, "FSDP2 bfloat16", "FSDP2 bfloat16", whole, half, data, args)
}

// TestFloat8AllGatherMatchesOneProcess: tensorwise float8 (bfloat16
// elsewhere) under FSDP2 with the float8 all-gather, with and without
// precomputed scales, trains bit for bit like FSDP2 gathering bfloat16
// (the gathered float8 weights are the same tensors) and like one process
// on the same microbatches (local_batch_size 1, two accumulation steps:
// the gradients are the same float32 sums). One process on one microbatch
// of both rows quantises differently, because the activations' and
// gradients' tensorwise scales span the microbatch: measured 4.5e-4
// relative over the 6 steps; float8Microbatch bounds it.
func TestFloat8AllGatherMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	const steps = 6
	const float8Microbatch = 2e-3
	data := corpus(t)
	run := func(extra ...string) map[int]float64 {
		t.Helper()
		dump := t.TempDir()
		args := append(tinyRun(dump, data, steps), "--set", "checkpoint.enable=false",
			"--set", "training.mixed_precision_param=bfloat16", "--set", `model.converters=["float8"]`, "--set", "float8.recipe_name=tensorwise")
		if out, err := titan(t, append(args, extra...)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return metricsColumn(t, dump, "loss")
	}
	fsdp := []string{"--nproc", "2", "--set", "parallelism.data_parallel_shard_degree=2", "--set", "training.local_batch_size=1"}
	gather8 := run(append(fsdp, "--set", "float8.enable_fsdp_float8_all_gather=true")...)
	for _, ref := range []struct {
		name string
		args []string
	}{
		{"FSDP2 gathering bfloat16", fsdp},
		{"precomputed scales", append(fsdp, "--set", "float8.enable_fsdp_float8_all_gather=true", "--set", "float8.precompute_float8_dynamic_scale_for_fsdp=true")},
		{"one process, the same microbatches", []string{"--set", "training.local_batch_size=1", "--set", "training.gradient_accumulation_steps=2"}},
	} {
		want := run(ref.args...)
		for step := 1; step <= steps; step++ {
			if gather8[step] != want[step] {
				t.Errorf("step %d: loss %.9g with the float8 all-gather, %.9g with %s", step, gather8[step], want[step], ref.name)
			}
		}
	}
	one := run()
	worst := 0.0
	for step := 1; step <= steps; step++ {
		d := math.Abs(gather8[step]-one[step]) / one[step]
		worst = max(worst, d)
		if d > float8Microbatch {
			t.Errorf("step %d: loss %.9g under FSDP2 with the float8 all-gather, %.9g in one process on one microbatch: more than %g apart", step, gather8[step], one[step], float8Microbatch)
		}
	}
	if worst == 0 {
		t.Error("one microbatch of two rows gave the losses of two of one row: are the activation scales per tensor?")
	}
	t.Logf("float8 all-gather FSDP2 against one process on one microbatch: worst loss difference %.3g relative", worst)
}

// float8TPTol is the agreement of float8 training under tensor
// parallelism with one process. Both cast the same values with the same
// scales, so the first step's loss agrees within float32 summation order
// (firstStepTol); after the first updates the masters differ in their
// last bits as in bfloat16 (mixedTol), and float8's coarser rounding
// amplifies what a bfloat16 flip moves: an element near an e4m3 rounding
// boundary moves by 2^-4 relative, and a changed amax moves a whole
// tensorwise scale. Measured over 6 steps of tiny_bench (worst of the
// recipes under TP2, and FSDP2×TP2): loss 7.3e-5 and 1.5e-4, grad norm
// 2.1e-4 and 1.6e-4, parameters 6.4e-5 and 1.1e-4 relative (bfloat16
// under TP2: 5.2e-6, 5.9e-5, 1.0e-5); the bounds leave a factor of 3 to
// 4 over them.
var float8TPTol = parityTol{loss: 5e-4, gradNorm: 1e-3, params: 5e-4}

// firstStepTol bounds the first step's loss difference under float8TPTol.
const firstStepTol = 1e-7

// TestFloat8TensorParallelMatchesOneProcess: float8 under TP2 (each
// recipe, bfloat16 elsewhere) trains like one float8 process: every tp
// rank casts its shards of the same values (the norm outputs' bfloat16
// rounding) with the whole tensors' scales (amaxes max all-reduced over
// the tp ranks), so the first step's loss agrees within firstStepTol and
// the run within float8TPTol. FSDP2×TP2 with the float8 all-gather (each
// weight's scale all-reduced over the shard group and the tp ranks)
// gives bit for bit the losses of FSDP2×TP2 gathering bfloat16 and of
// its precomputed scales, and those of one process on the same
// microbatches within the same bounds.
func TestFloat8TensorParallelMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	const steps = 6
	data := corpus(t)
	run := func(dump, recipe string, extra ...string) {
		t.Helper()
		args := append(tinyRun(dump, data, steps), "--set", "checkpoint.last_save_model_only=true",
			"--set", "training.mixed_precision_param=bfloat16", "--set", `model.converters=["float8"]`, "--set", "float8.recipe_name="+recipe)
		if out, err := titan(t, append(args, extra...)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	check := func(t *testing.T, name, one, dump string) {
		t.Helper()
		want, got := metricsColumn(t, one, "loss")[1], metricsColumn(t, dump, "loss")[1]
		d := math.Abs(got-want) / want
		if d > firstStepTol {
			t.Errorf("step 1: loss %.9g under %s, %.9g on one process: %.3g relative, want at most %g", got, name, want, d, firstStepTol)
		}
		t.Logf("%s: step 1 loss %.3g relative", name, d)
		checkParityWithin(t, name, one, dump, steps, float8TPTol)
	}
	tp2 := []string{"--nproc", "2", "--set", "parallelism.tensor_parallel_degree=2"}
	for _, recipe := range []string{"tensorwise", "rowwise", "rowwise_with_gw_hp"} {
		t.Run(recipe, func(t *testing.T) {
			one, dump := t.TempDir(), t.TempDir()
			run(one, recipe, "--set", "training.local_batch_size=4")
			run(dump, recipe, append([]string{"--set", "training.local_batch_size=4"}, tp2...)...)
			check(t, "TP2 float8 "+recipe, one, dump)
		})
	}
	t.Run("FSDP2xTP2 float8 all-gather", func(t *testing.T) {
		fsdp := []string{"--nproc", "4", "--set", "parallelism.data_parallel_shard_degree=2", "--set", "parallelism.tensor_parallel_degree=2"}
		gather8, one := t.TempDir(), t.TempDir()
		gather := append(fsdp, "--set", "float8.enable_fsdp_float8_all_gather=true")
		run(gather8, "tensorwise", gather...)
		got := metricsColumn(t, gather8, "loss")
		for _, ref := range []struct {
			name string
			args []string
		}{
			{"gathering bfloat16", fsdp},
			{"with precomputed scales", append(gather, "--set", "float8.precompute_float8_dynamic_scale_for_fsdp=true")},
		} {
			dump := t.TempDir()
			run(dump, "tensorwise", ref.args...)
			want := metricsColumn(t, dump, "loss")
			for step := 1; step <= steps; step++ {
				if got[step] != want[step] {
					t.Errorf("step %d: loss %.9g with the float8 all-gather, %.9g %s", step, got[step], want[step], ref.name)
				}
			}
		}
		run(one, "tensorwise", "--set", "training.gradient_accumulation_steps=2")
		check(t, "FSDP2xTP2 float8 all-gather", one, gather8)
	})
}
