package train

import (
	"context"
	"errors"
	"io"
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
	tr, err := New(job, io.Discard, nil)
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
