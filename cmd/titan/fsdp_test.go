package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/modelfile"
)

// metricsColumn reads one numeric column of metrics.jsonl by step.
func metricsColumn(t *testing.T, dump, key string) map[int]float64 {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dump, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]float64{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var r map[string]float64
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("metrics.jsonl line %q: %v", line, err)
		}
		v, ok := r[key]
		if !ok {
			t.Fatalf("metrics.jsonl line %q lacks %s", line, key)
		}
		out[int(r["step"])] = v
	}
	return out
}

// paramDistance is the L2 distance between the models of two final
// checkpoints, relative to the first one's norm.
func paramDistance(t *testing.T, dumpA, dumpB string) float64 {
	t.Helper()
	ma, err := modelfile.Load(filepath.Join(dumpA, "checkpoint"))
	if err != nil {
		t.Fatal(err)
	}
	mb, err := modelfile.Load(filepath.Join(dumpB, "checkpoint"))
	if err != nil {
		t.Fatal(err)
	}
	var d2, n2 float64
	for i := range ma.Params {
		d := float64(ma.Params[i] - mb.Params[i])
		d2 += d * d
		n2 += float64(ma.Params[i]) * float64(ma.Params[i])
	}
	return math.Sqrt(d2 / n2)
}

// TestShardedParallelismMatchesOneProcess: FSDP, DDP and HSDP layouts
// train like one process with the same global batch of 4 sequences: the
// same losses within 1e-5 relative at every one of 10 steps, the same
// parameters within 1e-5 (L2 relative) after them, and parameter +
// gradient + optimizer memory per worker (state_gib in metrics.jsonl)
// within 10% of 1/dp_shard of the one-process figure.
// checkResume copies the checkpoints of the 4-step run in half, resumes
// them to step 6 with args and requires steps 5 and 6 to match the
// uninterrupted run in whole (trained under refName) within 1e-5.
func checkResume(t *testing.T, name, refName, whole, half, data string, args []string) {
	t.Helper()
	ref := metricsColumn(t, whole, "loss")
	dump := t.TempDir()
	if err := os.CopyFS(dump, os.DirFS(half)); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dump, "metrics.jsonl"))
	if out, err := titan(t, append(tinyRun(dump, data, 6), args...)...); err != nil {
		t.Fatalf("resume: %v\n%s", err, out)
	}
	got := metricsColumn(t, dump, "loss")
	if _, ok := got[1]; ok || len(got) != 2 {
		t.Fatalf("logged steps %v, want only the resumed steps 5 and 6", got)
	}
	for step := 5; step <= 6; step++ {
		if x, y := ref[step], got[step]; y == 0 || math.Abs(x-y) > 1e-5*math.Abs(x) {
			t.Errorf("step %d: loss %.9g uninterrupted under %s, %.9g resumed under %s", step, x, refName, y, name)
		}
	}
}

// checkParity requires the run in dump to match the one-process run in ref:
// losses and gradient norms within 1e-5 relative at every step,
// parameters (final model-only checkpoint) within 1e-5 L2 relative; it
// logs the worst differences.
func checkParity(t *testing.T, name, ref, dump string, steps int) {
	t.Helper()
	checkParityWithin(t, name, ref, dump, steps, parityTol{1e-5, 1e-5, 1e-5})
}

// parityTol are the relative tolerances of checkParityWithin on the
// losses, the gradient norms and the parameters.
type parityTol struct{ loss, gradNorm, params float64 }

// checkParityWithin is checkParity with the tolerances tol.
func checkParityWithin(t *testing.T, name, ref, dump string, steps int, tol parityTol) {
	t.Helper()
	worst := map[string]float64{}
	for key, tol := range map[string]float64{"loss": tol.loss, "grad_norm": tol.gradNorm} {
		want, got := metricsColumn(t, ref, key), metricsColumn(t, dump, key)
		for step := 1; step <= steps; step++ {
			x, y := want[step], got[step]
			if y == 0 || math.Abs(x-y) > tol*math.Abs(x) {
				t.Errorf("step %d: %s %.9g on one process, %.9g under %s", step, key, x, y, name)
			}
			worst[key] = max(worst[key], math.Abs(x-y)/math.Abs(x))
		}
	}
	rel := paramDistance(t, ref, dump)
	if rel > tol.params {
		t.Errorf("parameters after %d steps differ by %.3g (L2 relative)", steps, rel)
	}
	t.Logf("%s: worst difference loss %.3g, grad_norm %.3g relative; parameters %.3g (L2 relative)", name, worst["loss"], worst["grad_norm"], rel)
}

func TestShardedParallelismMatchesOneProcess(t *testing.T) {
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
		name                      string
		nproc, replicate, shard   int
		reshard                   string
		wantStateFraction, nBatch int
	}{
		{"FSDP2", 2, 1, 2, "default", 2, 2},
		{"FSDP2/never", 2, 1, -1, "never", 2, 2},
		{"FSDP4", 4, 1, 4, "always", 4, 1},
		{"DDP2", 2, 2, 1, "default", 1, 2},
		{"HSDP2x2", 4, 2, 2, "default", 2, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			dump := t.TempDir()
			run(dump, "--nproc", itoa(c.nproc), "--set", "training.local_batch_size="+itoa(c.nBatch),
				"--set", "parallelism.data_parallel_replicate_degree="+itoa(c.replicate),
				"--set", "parallelism.data_parallel_shard_degree="+itoa(c.shard),
				"--set", "parallelism.fsdp_reshard_after_forward="+c.reshard)
			checkParity(t, c.name, one, dump, steps)
			state := metricsColumn(t, dump, "state_gib")
			ratio := state[1] / refState[1] * float64(c.wantStateFraction)
			if math.Abs(ratio-1) > 0.1 {
				t.Errorf("state per worker %.6f GiB, one process %.6f GiB: %.3f × the 1/%d share, want within 10%%", state[1], refState[1], ratio, c.wantStateFraction)
			}
			gathered := metricsColumn(t, dump, "gathered_units")[steps]
			t.Logf("%s: state %.6f GiB per worker vs %.6f GiB on one process (%.4f of it), %v gathered units at most", c.name, state[1], refState[1], state[1]/refState[1], gathered)
			// Resharding after each forward, a worker holds the unit it
			// computes and the one it prefetches; without, every unit.
			if c.shard > 1 && c.reshard != "never" && gathered > 2 {
				t.Errorf("%v units gathered at once, want at most 2", gathered)
			}
		})
	}
}

// TestShardedCheckpointReshards: a checkpoint written under FSDP2 (whole
// tensors) resumes under one process and under FSDP4, each loading its own
// ranges, and both continue like the uninterrupted FSDP2 run.
func TestShardedCheckpointReshards(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	data := corpus(t)
	fsdp2 := []string{"--nproc", "2", "--set", "training.local_batch_size=2", "--set", "lr_scheduler.total_steps=6"}
	whole := t.TempDir()
	if out, err := titan(t, append(tinyRun(whole, data, 6), fsdp2...)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	half := t.TempDir()
	if out, err := titan(t, append(tinyRun(half, data, 4), fsdp2...)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"one process", []string{"--set", "training.local_batch_size=4"}},
		{"FSDP4", []string{"--nproc", "4", "--set", "training.local_batch_size=1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkResume(t, c.name, "FSDP2", whole, half, data, append(c.args, "--set", "lr_scheduler.total_steps=6"))
		})
	}
}
