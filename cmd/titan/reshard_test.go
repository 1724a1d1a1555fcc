package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/train"
)

// reshardLayouts are the layouts of the resharding matrix, each with the
// local batch that makes the global batch 4 sequences.
var reshardLayouts = []struct {
	name  string
	world int
	args  []string
}{
	{"1proc", 1, []string{"--set", "training.local_batch_size=4"}},
	{"FSDP4", 4, []string{"--nproc", "4", "--set", "training.local_batch_size=1"}},
	{"FSDP2xTP2", 4, []string{"--nproc", "4", "--set", "parallelism.tensor_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=2", "--set", "training.local_batch_size=2"}},
	{"PP2xFSDP2", 4, []string{"--nproc", "4", "--set", "parallelism.pipeline_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=2",
		"--set", "parallelism.pipeline_parallel_schedule=1F1B", "--set", "parallelism.pipeline_parallel_microbatch_size=1", "--set", "training.local_batch_size=2"}},
	{"TP2xCP2", 4, []string{"--nproc", "4", "--set", "parallelism.tensor_parallel_degree=2", "--set", "parallelism.context_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=1", "--set", "training.local_batch_size=4"}},
}

// reshardRun is the override set of the matrix's runs: steps of 8 in one
// schedule, a full checkpoint at step 3 (and 6) and at the end.
func reshardRun(dump, data string, steps int, layout []string) []string {
	args := append(tinyRun(dump, data, steps), "--set", "training.seq_len=16", "--set", "lr_scheduler.total_steps=8",
		"--set", "checkpoint.interval=3", "--set", "checkpoint.keep_latest_k=0", "--set", "training.threads=1")
	return append(args, layout...)
}

// readAll reads every tensor of the checkpoint in dir, whole.
func readAll(t *testing.T, dir string) (map[string][]float32, *checkpoint.Reader) {
	t.Helper()
	r, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]float32{}
	for name, tm := range r.Meta.Tensors {
		n := 1
		for _, s := range tm.Shape {
			n *= s
		}
		buf := make([]float32, n)
		if err := r.Read(name, 0, buf); err != nil {
			t.Fatal(err)
		}
		out[name] = buf
	}
	return out, r
}

// sameState requires the checkpoints in a and b to hold the same tensors
// bit for bit, the same data loader position and the same train state
// keys.
func sameState(t *testing.T, what, a, b string, keys ...string) {
	t.Helper()
	ta, ra := readAll(t, a)
	tb, rb := readAll(t, b)
	if len(ta) != len(tb) {
		t.Fatalf("%s: %d tensors saved, %d after the load", what, len(ta), len(tb))
	}
	for name, x := range ta {
		y, ok := tb[name]
		if !ok {
			t.Fatalf("%s: %s missing after the load", what, name)
		}
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
				t.Fatalf("%s: %s[%d] = %v saved, %v after the load", what, name, i, x[i], y[i])
			}
		}
	}
	for _, blob := range []string{"dataloader.json", "model_config.json"} {
		x, err1 := ra.Blob(blob)
		y, err2 := rb.Blob(blob)
		if err1 != nil || err2 != nil || !bytes.Equal(x, y) {
			t.Fatalf("%s: %s differs after the load (%v, %v)", what, blob, err1, err2)
		}
	}
	var sa, sb map[string]any
	xa, _ := ra.Blob(checkpoint.TrainStateBlob)
	xb, _ := rb.Blob(checkpoint.TrainStateBlob)
	json.Unmarshal(xa, &sa)
	json.Unmarshal(xb, &sb)
	for _, k := range keys {
		if sa[k] != sb[k] {
			t.Fatalf("%s: train state %s = %v saved, %v after the load", what, k, sa[k], sb[k])
		}
	}
}

// TestReshardingMatrix: a full checkpoint saved under each of five
// layouts (one process, FSDP4, FSDP2×TP2, PP2×FSDP2, TP2×CP2; every rank
// writing its own shards) loads under each of the five: what is loaded
// is bit for bit what was saved (the loading layout saves it again, and
// every tensor, the data position and the train state are compared),
// the 5 steps that follow agree within 1e-5 relative with the loading
// layout's uninterrupted run, and a resume under the saving layout
// reproduces its uninterrupted run bitwise: losses and final parameters.
func TestReshardingMatrix(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	start := time.Now()
	data := corpus(t)
	whole := map[string]string{}
	for _, l := range reshardLayouts {
		dump := t.TempDir()
		if out, err := titan(t, reshardRun(dump, data, 8, l.args)...); err != nil {
			t.Fatalf("%s: %v\n%s", l.name, err, out)
		}
		whole[l.name] = dump
		r, err := checkpoint.Open(checkpoint.StepDir(filepath.Join(dump, "checkpoint"), 3))
		if err != nil {
			t.Fatal(err)
		}
		if world := l.world; r.Meta.Layout == nil || r.Meta.Layout.World != world || len(r.Meta.Ranks) != world {
			t.Fatalf("%s: step-3 records layout %+v and parts %v", l.name, r.Meta.Layout, r.Meta.Ranks)
		}
	}
	for _, src := range reshardLayouts {
		for _, dst := range reshardLayouts {
			t.Run(src.name+"→"+dst.name, func(t *testing.T) {
				dump := t.TempDir()
				from := checkpoint.StepDir(filepath.Join(whole[src.name], "checkpoint"), 3)
				if err := os.CopyFS(checkpoint.StepDir(filepath.Join(dump, "checkpoint"), 3), os.DirFS(from)); err != nil {
					t.Fatal(err)
				}
				resaved := filepath.Join(t.TempDir(), "resaved")
				t.Setenv(train.ResaveEnv, resaved)
				// No interval saves on the way: only the final one is compared.
				if out, err := titan(t, append(reshardRun(dump, data, 8, dst.args), "--set", "checkpoint.interval=100")...); err != nil {
					t.Fatalf("%v\n%s", err, out)
				}
				sameState(t, src.name+" loaded under "+dst.name, from, checkpoint.StepDir(resaved, 3), "step", "optimizer_step", "seed", "flavor", "elapsed_s")
				ref := whole[dst.name]
				want, got := metricsColumn(t, ref, "loss"), metricsColumn(t, dump, "loss")
				if len(got) != 5 {
					t.Fatalf("resumed steps %v, want 4..8", got)
				}
				for step := 4; step <= 8; step++ {
					if x, y := want[step], got[step]; y == 0 || math.Abs(x-y) > 1e-5*math.Abs(x) {
						t.Errorf("step %d: loss %.9g uninterrupted under %s, %.9g resumed from %s", step, x, dst.name, y, src.name)
					}
				}
				if src.name != dst.name {
					return
				}
				// The same layout: bitwise.
				wl, gl := losses(t, ref), losses(t, dump)
				for step := 4; step <= 8; step++ {
					if wl[step] != gl[step] {
						t.Errorf("step %d: loss %s uninterrupted, %s resumed: not bitwise", step, wl[step], gl[step])
					}
				}
				sameState(t, "final state of the resumed "+dst.name, checkpoint.StepDir(filepath.Join(ref, "checkpoint"), 8), checkpoint.StepDir(filepath.Join(dump, "checkpoint"), 8), "step", "optimizer_step", "seed")
			})
		}
	}
	t.Logf("matrix of %d layouts: %v", len(reshardLayouts), time.Since(start).Round(time.Second))
}
