package train

import (
	"bytes"
	"context"
	"errors"
	"github.com/titan-go/titan/internal/backend/cpu"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/config"
)

func testJob(t *testing.T, dump string, steps int) *config.Job {
	t.Helper()
	data := filepath.Join(t.TempDir(), "corpus.txt")
	os.WriteFile(data, []byte(strings.Repeat("a stitch in time saves nine; measure twice, cut once.\n", 300)), 0o644)
	job, err := config.Load("", []string{
		"model.flavor=tiny_bench", "training.seq_len=16", "training.local_batch_size=2",
		"training.dataset=text", "training.dataset_path=" + data, "training.steps=" + strconv.Itoa(steps),
		"training.seed=3", "lr_scheduler.warmup_steps=2", "metrics.log_freq=100",
		"checkpoint.enable=true", "checkpoint.interval=1000", "checkpoint.last_save_model_only=false",
		"job.dump_folder=" + dump,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return job
}

func lossesOf(t *testing.T, job *config.Job, stopAt int) []float64 {
	t.Helper()
	tr, err := New(job, testDevice(0), io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var losses []float64
	tr.OnStep = func(step int, loss float64) {
		losses = append(losses, loss)
		if step == stopAt {
			cancel() // what Ctrl-C does
		}
	}
	err = tr.Run(ctx)
	if stopAt > 0 && !errors.Is(err, context.Canceled) || stopAt == 0 && err != nil {
		t.Fatalf("run: %v", err)
	}
	return losses
}

// TestInterruptAndResume: Ctrl-C after step 6 saves a checkpoint; the
// resumed run continues exactly where an uninterrupted run would be.
func TestInterruptAndResume(t *testing.T) {
	whole := lossesOf(t, testJob(t, t.TempDir(), 12), 0)
	dump := t.TempDir()
	first := lossesOf(t, testJob(t, dump, 12), 6)
	second := lossesOf(t, testJob(t, dump, 12), 0)
	got := append(first, second...)
	if len(got) != 12 || len(whole) != 12 {
		t.Fatalf("%d and %d losses, want 12", len(got), len(whole))
	}
	for i := range whole {
		if got[i] != whole[i] {
			t.Errorf("step %d: loss %v after an interrupt, %v uninterrupted", i+1, got[i], whole[i])
		}
	}
}

// TestInterruptRightAfterASave: Ctrl-C after a step whose periodic
// checkpoint was just written does not write it again, and the run
// resumes from it exactly.
func TestInterruptRightAfterASave(t *testing.T) {
	whole := lossesOf(t, testJob(t, t.TempDir(), 9), 0)
	dump := t.TempDir()
	job := testJob(t, dump, 9)
	job.Checkpoint.Interval = 3
	var log bytes.Buffer
	tr, err := New(job, testDevice(0), &log, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got []float64
	tr.OnStep = func(step int, loss float64) {
		got = append(got, loss)
		if step == 6 {
			cancel()
		}
	}
	if err := tr.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v", err)
	}
	tr.Close()
	out := log.String()
	if n := strings.Count(out, "checkpoint step-6 "); n != 1 || !strings.Contains(out, "interrupted after step 6, whose checkpoint is already saved") {
		t.Errorf("step 6's checkpoint written %d times (want 1), log:\n%s", n, out)
	}
	again := testJob(t, dump, 9)
	again.Checkpoint.Interval = 3
	got = append(got, lossesOf(t, again, 0)...)
	if len(got) != 9 {
		t.Fatalf("%d losses, want 9", len(got))
	}
	for i := range whole {
		if got[i] != whole[i] {
			t.Errorf("step %d: loss %v after the interrupt, %v uninterrupted", i+1, got[i], whole[i])
		}
	}
}

// TestInterruptWithoutCheckpointingSavesNothing: with checkpoint.enable
// off, Ctrl-C stops the run without writing a checkpoint, as the last
// step writes none.
func TestInterruptWithoutCheckpointingSavesNothing(t *testing.T) {
	dump := t.TempDir()
	job := testJob(t, dump, 8)
	job.Checkpoint.Enable = false
	lossesOf(t, job, 3)
	if steps, _ := filepath.Glob(filepath.Join(dump, job.Checkpoint.Folder, "step-*")); len(steps) != 0 {
		t.Errorf("checkpoint.enable off, interrupted: saved %v", steps)
	}
}

// TestResumeWithOtherDataIsRefused: a checkpoint saved with validation
// holding part of the training data out, resumed with validation off,
// reads other training data: the run stops, calling the checkpoint
// intact and naming the keys to set back, rather than skipping it as
// damaged.
func TestResumeWithOtherDataIsRefused(t *testing.T) {
	dump := t.TempDir()
	job := testJob(t, dump, 4)
	job.Validation.Enable, job.Validation.Freq, job.Validation.Steps = true, 2, 1
	job.Validation.LocalBatchSize, job.Validation.SeqLen = 2, 16
	lossesOf(t, job, 2)
	again := testJob(t, dump, 4)
	again.Training.DatasetPath = job.Training.DatasetPath
	tr, err := New(again, testDevice(0), io.Discard, nil)
	if err == nil {
		err = tr.Run(context.Background())
		tr.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "is intact") || !strings.Contains(err.Error(), "validation.enable") || strings.Contains(err.Error(), "damaged") {
		t.Fatalf("resumed with validation off: %v; want a refusal calling the checkpoint intact and naming validation.enable", err)
	}
}

// TestActivationCheckpointingTrainsIdentically: the recipe's
// [activation_checkpoint] policy reaches the model (its activation plan
// shrinks) and changes nothing in training: every policy's losses over
// five steps are bitwise those of keeping every activation.
func TestActivationCheckpointingTrainsIdentically(t *testing.T) {
	var ref []float64
	var refBytes int64
	for _, c := range []struct{ mode, option string }{
		{"none", "2"}, {"full", "2"}, {"selective", "2"}, {"selective", "op"},
	} {
		job := testJob(t, t.TempDir(), 5)
		job.Checkpoint.Enable = false
		job.ActivationCheckpoint.Mode, job.ActivationCheckpoint.SelectiveACOption = c.mode, c.option
		tr, err := New(job, testDevice(0), io.Discard, nil)
		if err != nil {
			t.Fatal(err)
		}
		bytes := tr.eng.Memory().ActivationBytes
		var losses []float64
		tr.OnStep = func(_ int, loss float64) { losses = append(losses, loss) }
		err = tr.Run(context.Background())
		tr.Close()
		if err != nil {
			t.Fatalf("%s %s: %v", c.mode, c.option, err)
		}
		if ref == nil {
			ref, refBytes = losses, bytes
			continue
		}
		if bytes >= refBytes {
			t.Errorf("%s %s: %d activation bytes, none has %d", c.mode, c.option, bytes, refBytes)
		}
		for i := range ref {
			if losses[i] != ref[i] {
				t.Errorf("%s %s: step %d loss %v, none %v", c.mode, c.option, i+1, losses[i], ref[i])
			}
		}
	}
}

// TestGradientAccumulation: a global batch of 4 sequences taken as two
// microbatches of 2 trains like one batch of 4 (the loss is normalised by
// the global number of targets), within float32 reordering.
func TestGradientAccumulation(t *testing.T) {
	whole := testJob(t, t.TempDir(), 6)
	whole.Training.LocalBatchSize = 4
	accum := testJob(t, t.TempDir(), 6)
	accum.Training.GlobalBatchSize = 4 // local 2 → 2 microbatches
	a, b := lossesOf(t, whole, 0), lossesOf(t, accum, 0)
	for i := range a {
		if d := math.Abs(a[i] - b[i]); d > 1e-5*math.Abs(a[i]) {
			t.Errorf("step %d: loss %v with batch 4, %v with 2×2 accumulation", i+1, a[i], b[i])
		}
	}
	bad := testJob(t, t.TempDir(), 1)
	bad.Training.GlobalBatchSize = 5
	if _, err := New(bad, testDevice(0), io.Discard, nil); err == nil || !strings.Contains(err.Error(), "global_batch_size") {
		t.Errorf("global batch 5 over local 2: %v", err)
	}
}

// testDevice is the CPU backend with threads workers (0: all cores).
func testDevice(threads int) Device {
	return Device{Backend: cpu.New(threads), Name: "cpu (test)", PeakFLOPS: 1e11}
}
