package main

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/modelfile"
)

// TestDataParallelMatchesOneProcess: 2 workers with 2 sequences each train
// like one process with 4 sequences: the same losses within 1e-5 relative
// at every step, and the same parameters after 8 steps.
func TestDataParallelMatchesOneProcess(t *testing.T) {
	data := corpus(t)
	one, two := t.TempDir(), t.TempDir()
	run := func(dump string, batch string, extra ...string) {
		args := append(tinyRun(dump, data, 8), "--set", "training.local_batch_size="+batch, "--set", "checkpoint.last_save_model_only=true")
		if out, err := titan(t, append(args, extra...)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	run(one, "4")
	run(two, "2", "--nproc", "2")
	a, b := losses(t, one), losses(t, two)
	for step := 1; step <= 8; step++ {
		x, _ := json.Number(a[step]).Float64()
		y, _ := json.Number(b[step]).Float64()
		if a[step] == "" || math.Abs(x-y) > 1e-5*math.Abs(x) {
			t.Errorf("step %d: loss %s on one process, %s on two", step, a[step], b[step])
		}
	}
	ma, err := modelfile.Load(filepath.Join(one, "checkpoint"))
	if err != nil {
		t.Fatal(err)
	}
	mb, err := modelfile.Load(filepath.Join(two, "checkpoint"))
	if err != nil {
		t.Fatal(err)
	}
	var d2, n2 float64
	for i := range ma.Params {
		d := float64(ma.Params[i] - mb.Params[i])
		d2 += d * d
		n2 += float64(ma.Params[i]) * float64(ma.Params[i])
	}
	if rel := math.Sqrt(d2 / n2); rel > 1e-5 {
		t.Errorf("parameters after 8 steps differ by %.3g (L2 relative)", rel)
	}
}

// TestWorkerFailureStopsTheJob: an impossible layout on the workers makes
// them fail; the launcher reports which rank and how.
func TestWorkerFailureStopsTheJob(t *testing.T) {
	args := append(tinyRun(t.TempDir(), corpus(t), 2), "--nproc", "2", "--set", "parallelism.tensor_parallel_degree=2")
	_, err := titan(t, args...)
	if err == nil || !strings.Contains(err.Error(), "rank") {
		t.Fatalf("got %v, want an error naming the failed rank", err)
	}
}

// TestBenchCommJSON: the comm benchmark prints nccl-tests fields as JSON.
func TestBenchCommJSON(t *testing.T) {
	out, err := titan(t, "bench", "comm", "--op", "all_gather", "--size", "1MiB", "--nproc", "2", "--iters", "3", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var r map[string]any
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not JSON: %q", out)
	}
	for _, k := range []string{"op", "size_bytes", "nproc", "time_s", "algbw_gbps", "busbw_gbps"} {
		if _, ok := r[k]; !ok {
			t.Errorf("missing %s in %s", k, out)
		}
	}
	if r["nproc"] != 2.0 || r["size_bytes"] != float64(1<<20) || r["busbw_gbps"].(float64) <= 0 {
		t.Errorf("unexpected result %s", out)
	}
	if _, err := titan(t, "bench", "comm", "--op", "gather"); err == nil {
		t.Error("an unknown op must be refused")
	}
}

// TestSlurmTrain: `srun -n 4 titan train ...` on the one-host Slurm
// cluster of scripts/slurm/setup-single-host.sh trains like one process
// with the same global batch, with no launcher flags.
func TestSlurmTrain(t *testing.T) {
	srun, err := exec.LookPath("srun")
	if err != nil {
		t.Skip("srun not found: run scripts/slurm/setup-single-host.sh as root to set up a one-host Slurm cluster")
	}
	if st, err := exec.Command("sinfo", "-h", "-o", "%T").Output(); err != nil || !strings.Contains(string(st), "idle") {
		t.Skipf("no idle Slurm node (sinfo: %q, %v): run scripts/slurm/setup-single-host.sh", st, err)
	}
	data := corpus(t)
	one, four := t.TempDir(), t.TempDir()
	if out, err := titan(t, append(tinyRun(one, data, 4), "--set", "training.local_batch_size=4")...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-n", "4", "--overcommit", "--kill-on-bad-exit=1", "--time=3", "--job-name=titan-train-test", exe},
		append(tinyRun(four, data, 4), "--set", "training.local_batch_size=1")...)
	cmd := exec.Command(srun, args...)
	cmd.Env = append(os.Environ(), "TITANTEST_RUN_MAIN=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("srun: %v\n%s", err, out)
	}
	a, b := losses(t, one), losses(t, four)
	for step := 1; step <= 4; step++ {
		x, _ := json.Number(a[step]).Float64()
		y, _ := json.Number(b[step]).Float64()
		if a[step] == "" || math.Abs(x-y) > 1e-5*math.Abs(x) {
			t.Errorf("step %d: loss %s on one process, %s on 4 Slurm tasks", step, a[step], b[step])
		}
	}
}
