package train

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/checkpoint"
)

// TestAsyncSavesMatchSync: under both asynchronous modes, a run saving
// every step trains exactly as one saving synchronously and writes the
// same checkpoints bit for bit (run it with -race: the background writer
// shares the snapshot with nothing).
func TestAsyncSavesMatchSync(t *testing.T) {
	var ref []float64
	var refDir string
	for _, mode := range []string{"disabled", "async", "async_with_pinned_mem"} {
		dump := t.TempDir()
		job := testJob(t, dump, 4)
		job.Checkpoint.AsyncMode = mode
		job.Checkpoint.Interval = 1
		job.Checkpoint.KeepLatestK = 0
		losses := lossesOf(t, job, 0)
		dir := filepath.Join(dump, job.Checkpoint.Folder)
		if mode == "disabled" {
			ref, refDir = losses, dir
			continue
		}
		for i := range ref {
			if losses[i] != ref[i] {
				t.Errorf("%s: step %d loss %v, synchronous %v", mode, i+1, losses[i], ref[i])
			}
		}
		for step := 1; step <= 4; step++ {
			a, b := readTensors(t, checkpoint.StepDir(refDir, step)), readTensors(t, checkpoint.StepDir(dir, step))
			if len(a) != len(b) || len(a) == 0 {
				t.Fatalf("%s step %d: %d tensors, synchronous %d", mode, step, len(b), len(a))
			}
			for name, x := range a {
				y := b[name]
				for i := range x {
					if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
						t.Fatalf("%s step %d: %s[%d] = %v, synchronous %v", mode, step, name, i, y[i], x[i])
					}
				}
			}
		}
	}
}

// readTensors reads every tensor of a checkpoint whole.
func readTensors(t *testing.T, dir string) map[string][]float32 {
	t.Helper()
	r, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	out := map[string][]float32{}
	for name, tm := range r.Meta.Tensors {
		n := 1
		for _, d := range tm.Shape {
			n *= d
		}
		out[name] = make([]float32, n)
		if err := r.Read(name, 0, out[name]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestBackgroundSaveErrorFailsTheRun: a background save that fails (its
// checkpoint folder has become a file) fails the run with its error at
// the next step, under both asynchronous modes, instead of being lost;
// the steps after it are not trained.
func TestBackgroundSaveErrorFailsTheRun(t *testing.T) {
	for _, mode := range []string{"async", "async_with_pinned_mem"} {
		t.Run(mode, func(t *testing.T) {
			dump := t.TempDir()
			job := testJob(t, dump, 6)
			job.Checkpoint.AsyncMode = mode
			job.Checkpoint.Interval = 2
			tr, err := New(job, testDevice(0), io.Discard, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			ck := filepath.Join(dump, job.Checkpoint.Folder)
			os.RemoveAll(ck)
			if err := os.WriteFile(ck, []byte("not a folder"), 0o644); err != nil {
				t.Fatal(err)
			}
			last := 0
			tr.OnStep = func(step int, _ float64) { last = step }
			err = tr.Run(context.Background())
			if err == nil || !strings.Contains(err.Error(), "checkpoint") || !strings.Contains(err.Error(), "not a directory") {
				t.Fatalf("run: %v, want the background save's error", err)
			}
			t.Logf("the run stopped after step %d", last)
		})
	}
}

// TestElapsedTimeIsSaved: every interval checkpoint records the training
// time so far (a resumed run's elapsed time continues from it), growing
// from save to save, not the 0 the loop's start would give.
func TestElapsedTimeIsSaved(t *testing.T) {
	dump := t.TempDir()
	job := testJob(t, dump, 6)
	job.Checkpoint.Interval = 2
	job.Checkpoint.KeepLatestK = 0
	lossesOf(t, job, 0)
	prev := 0.0
	for step := 2; step <= 6; step += 2 {
		r, err := checkpoint.Open(checkpoint.StepDir(filepath.Join(dump, job.Checkpoint.Folder), step))
		if err != nil {
			t.Fatal(err)
		}
		raw, err := r.Blob(checkpoint.TrainStateBlob)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		var ts trainState
		if err := json.Unmarshal(raw, &ts); err != nil {
			t.Fatal(err)
		}
		if ts.Step != step || !(ts.ElapsedS > prev) {
			t.Errorf("step-%d: step %d, elapsed %g s; want step %d and more than step-%d's %g s", step, ts.Step, ts.ElapsedS, step, step-2, prev)
		}
		prev = ts.ElapsedS
	}
}

// TestTrainingPastTheFlavorsContext: as torchtitan, a llama3 recipe may
// train longer sequences than its flavor's max_seq_len (tiny_bench:
// 2048), and the model it saves records the length it was trained at.
func TestTrainingPastTheFlavorsContext(t *testing.T) {
	dump := t.TempDir()
	job := testJob(t, dump, 1)
	job.Training.SeqLen = 2560
	job.Training.LocalBatchSize = 1
	data := filepath.Join(t.TempDir(), "long.txt")
	os.WriteFile(data, []byte(strings.Repeat("a stitch in time saves nine; measure twice, cut once.\n", 4000)), 0o644)
	job.Training.DatasetPath = data
	lossesOf(t, job, 0)
	r, err := checkpoint.Open(checkpoint.StepDir(filepath.Join(dump, job.Checkpoint.Folder), 1))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	raw, err := r.Blob("model_config.json")
	if err != nil {
		t.Fatal(err)
	}
	var desc struct {
		Config struct {
			MaxSeqLen int `json:"MaxSeqLen"`
		} `json:"config"`
	}
	if err := json.Unmarshal(raw, &desc); err != nil {
		t.Fatal(err)
	}
	if desc.Config.MaxSeqLen != 2560 {
		t.Errorf("model_config.json max_seq_len %d, want the trained 2560 (%s)", desc.Config.MaxSeqLen, raw)
	}
}
