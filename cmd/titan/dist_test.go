package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/modelfile"
	"github.com/titan-go/titan/internal/testenv"
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
	args := append(tinyRun(t.TempDir(), corpus(t), 2), "--nproc", "2", "--set", "parallelism.context_parallel_degree=2", "--set", "training.seq_len=30")
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
	const setup = "run scripts/slurm/setup-single-host.sh as root to set up a one-host Slurm cluster"
	srun := testenv.Tool(t, "srun", setup)
	st, err := exec.Command("sinfo", "-h", "-o", "%T").Output()
	testenv.Require(t, fmt.Sprintf("an idle Slurm node (sinfo: %q, %v; %s)", st, err, setup), err == nil && strings.Contains(string(st), "idle"))
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

// TestTwoNodesOnLoopback: two launchers acting as two nodes (one worker
// each) train like one process with the same global batch.
func TestTwoNodesOnLoopback(t *testing.T) {
	data := corpus(t)
	one, two := t.TempDir(), t.TempDir()
	if out, err := titan(t, append(tinyRun(one, data, 4), "--set", "training.local_batch_size=2")...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := l.Addr().String()
	l.Close()
	exe, _ := os.Executable()
	const secret = "loopback-test-secret-0123456789"
	secretFile := filepath.Join(t.TempDir(), "job.secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	outs := make([]*bytes.Buffer, 2)
	for node := 0; node < 2; node++ {
		args := append(tinyRun(two, data, 4), "--set", "training.local_batch_size=1",
			"--nnodes", "2", "--node-rank", strconv.Itoa(node), "--rdzv-endpoint", endpoint, "--nproc", "1",
			"--rdzv-secret-file", secretFile)
		cmd := exec.Command(exe, args...)
		outs[node] = &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = outs[node], outs[node]
		cmd.Env = append(os.Environ(), "TITANTEST_RUN_MAIN=1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for node, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("node %d: %v\n%s", node, err, outs[node])
		}
		if strings.Contains(outs[node].String(), secret) {
			t.Errorf("node %d's output shows the job secret:\n%s", node, outs[node])
		}
	}
	a, b := losses(t, one), losses(t, two)
	for step := 1; step <= 4; step++ {
		x, _ := json.Number(a[step]).Float64()
		y, _ := json.Number(b[step]).Float64()
		if a[step] == "" || math.Abs(x-y) > 1e-5*math.Abs(x) {
			t.Errorf("step %d: loss %s on one process, %s on two nodes", step, a[step], b[step])
		}
	}
}
