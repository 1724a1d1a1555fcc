package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInterruptExitsWith130: Ctrl-C (SIGINT to the launcher) during a
// two-worker run saves a checkpoint and exits with status 130, as a
// shell reports a command SIGINT ended (a failure exits 1); the same
// command then resumes.
func TestInterruptExitsWith130(t *testing.T) {
	dump, data := interrupted(t, os.Interrupt, 130)
	out, err := titan(t, tinyRun(dump, data, 60)...)
	if err != nil || !strings.Contains(out, "resum") || !strings.Contains(out, "step    60") {
		t.Errorf("resuming after SIGINT: %v\n%s", err, out)
	}
}

// TestTerminateExitsWith143: SIGTERM to the launcher (a scheduler's
// preemption) saves a checkpoint too and exits with 128 + 15, so that a
// scheduler tells it from a Ctrl-C.
func TestTerminateExitsWith143(t *testing.T) {
	interrupted(t, syscall.SIGTERM, 143)
}

// interrupted starts a two-worker run, sends the launcher sig at step 3
// and checks that it exits with status want, printing the resume hint,
// after saving a checkpoint; it returns the run's dump folder and corpus.
func interrupted(t *testing.T, sig os.Signal, want int) (dump, data string) {
	t.Helper()
	dump, data = t.TempDir(), corpus(t)
	p := startTitan(t, nil, append(tinyRun(dump, data, 60), "--nproc", "2")...)
	p.await(t, `step +3 `, 0)
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-p.done:
		p.done <- err
	case <-time.After(120 * time.Second):
		t.Fatalf("no exit after %v:\n%s", sig, p.out)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != want || !strings.Contains(p.out.String(), "interrupted; resume with the same command") {
		t.Fatalf("after %v: %v, want exit status %d and the resume hint\n%s", sig, err, want, p.out)
	}
	if steps, _ := filepath.Glob(filepath.Join(dump, "checkpoint", "step-*")); len(steps) == 0 {
		t.Fatalf("no checkpoint saved on %v\n%s", sig, p.out)
	}
	return dump, data
}

// TestResumeWithAnotherBatchWarns: a checkpoint saved by two data ranks
// resumed by one trains on with half the batch, which the resumed run's
// log says, naming training.global_batch_size; with that key set to the
// saved batch it says nothing.
func TestResumeWithAnotherBatchWarns(t *testing.T) {
	data := corpus(t)
	for _, c := range []struct {
		name string
		sets []string
		warn bool
	}{
		{"local batch", nil, true},
		{"global batch", []string{"--set", "training.global_batch_size=4"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dump := t.TempDir()
			if out, err := titan(t, append(tinyRun(dump, data, 10), "--nproc", "2")...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			out, err := titan(t, append(tinyRun(dump, data, 12), c.sets...)...)
			if err != nil || !strings.Contains(out, "resumed") {
				t.Fatalf("resuming: %v\n%s", err, out)
			}
			if got := strings.Contains(out, "was saved by a run of 4 sequences a step; this one takes 2") && strings.Contains(out, "training.global_batch_size = 4"); got != c.warn {
				t.Errorf("warning about the batch: %v, want %v\n%s", got, c.warn, out)
			}
		})
	}
}
