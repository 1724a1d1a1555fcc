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
	dump, data := t.TempDir(), corpus(t)
	args := append(tinyRun(dump, data, 60), "--nproc", "2")
	p := startTitan(t, nil, args...)
	p.await(t, `step +3 `, 0)
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-p.done:
		p.done <- err
	case <-time.After(120 * time.Second):
		t.Fatalf("no exit after SIGINT:\n%s", p.out)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 130 || !strings.Contains(p.out.String(), "interrupted; resume with the same command") {
		t.Fatalf("after SIGINT: %v, want exit status 130 and the resume hint\n%s", err, p.out)
	}
	steps, _ := filepath.Glob(filepath.Join(dump, "checkpoint", "step-*"))
	if len(steps) == 0 {
		t.Fatalf("no checkpoint saved on SIGINT\n%s", p.out)
	}
	out, err := titan(t, tinyRun(dump, data, 60)...)
	if err != nil || !strings.Contains(out, "resum") || !strings.Contains(out, "step    60") {
		t.Errorf("resuming after SIGINT: %v\n%s", err, out)
	}
}

// TestTerminateExitsWith143: SIGTERM to the launcher (a scheduler's
// preemption) saves a checkpoint too and exits with 128 + 15, so that a
// scheduler tells it from a Ctrl-C.
func TestTerminateExitsWith143(t *testing.T) {
	dump, data := t.TempDir(), corpus(t)
	p := startTitan(t, nil, append(tinyRun(dump, data, 60), "--nproc", "2")...)
	p.await(t, `step +3 `, 0)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-p.done:
		p.done <- err
	case <-time.After(120 * time.Second):
		t.Fatalf("no exit after SIGTERM:\n%s", p.out)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 143 || !strings.Contains(p.out.String(), "interrupted; resume with the same command") {
		t.Fatalf("after SIGTERM: %v, want exit status 143 and the resume hint\n%s", err, p.out)
	}
	if steps, _ := filepath.Glob(filepath.Join(dump, "checkpoint", "step-*")); len(steps) == 0 {
		t.Fatalf("no checkpoint saved on SIGTERM\n%s", p.out)
	}
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
