package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/checkpoint"
)

// TestKillDuringSaveResumes: a run killed with SIGKILL (every process of
// it) while its ranks are writing the checkpoint of step 4 — one
// process, saving synchronously, and FSDP2, saving in the background —
// leaves the checkpoint of step 2 intact and the step 4 save invisible
// (a temporary folder, never a step folder); the run started again
// resumes from step 2, removes the dead save's folder, and its losses
// from step 3 on are bitwise those of an uninterrupted run.
func TestKillDuringSaveResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	data := corpus(t)
	for _, c := range []struct {
		name  string
		world int
		args  []string
	}{
		{"1proc sync", 1, []string{"--set", "training.local_batch_size=4"}},
		{"FSDP2 async", 2, []string{"--nproc", "2", "--set", "training.local_batch_size=2", "--set", "checkpoint.async_mode=async"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			run := func(dump string) []string {
				return append(tinyRun(dump, data, 6), append([]string{"--set", "checkpoint.interval=2", "--set", "checkpoint.keep_latest_k=0", "--set", "training.threads=1"}, c.args...)...)
			}
			ref := t.TempDir()
			if out, err := titan(t, run(ref)...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			dump := t.TempDir()
			ck := filepath.Join(dump, "checkpoint")
			cmd := exec.Command(os.Args[0], run(dump)...)
			cmd.Env = append(os.Environ(), "TITANTEST_RUN_MAIN=1", checkpoint.PauseEnv+"=4:2m")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			var log strings.Builder
			cmd.Stdout, cmd.Stderr = &log, &log
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Every rank is in the middle of writing step 4.
			deadline := time.Now().Add(2 * time.Minute)
			for {
				ann, _ := filepath.Glob(filepath.Join(ck, ".tmp-step-4-*.writing-*"))
				if len(ann) == c.world {
					break
				}
				if time.Now().After(deadline) {
					syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
					cmd.Wait()
					t.Fatalf("the save of step 4 never started\n%s", log.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			cmd.Wait()
			// The workers die with their launcher (Pdeathsig), a moment later.
			waitGone(t, filepath.Join(dump, checkpoint.LockFile))
			infos, problems, err := checkpoint.Scan(ck)
			if err != nil || len(infos) != 1 || infos[0].Step != 2 || !infos[0].Meta.Full() || len(problems) != 0 {
				t.Fatalf("after the kill: checkpoints %v, problems %v, %v", infos, problems, err)
			}
			if tmp, _ := filepath.Glob(filepath.Join(ck, ".tmp-step-4-*")); len(tmp) == 0 {
				t.Fatal("no trace of the interrupted save: the kill came too late to test anything")
			}
			os.Remove(filepath.Join(dump, "metrics.jsonl"))
			out, err := titan(t, run(dump)...)
			if err != nil {
				t.Fatalf("resume: %v\n%s", err, out)
			}
			if c.world == 1 && !strings.Contains(out, "resumed from "+checkpoint.StepDir(ck, 2)) {
				t.Errorf("the resume does not say it resumed from step 2:\n%s", out)
			}
			if tmp, _ := filepath.Glob(filepath.Join(ck, ".tmp-step-4-*")); len(tmp) != 0 {
				t.Errorf("the dead save's folder is still there: %v", tmp)
			}
			want, got := losses(t, ref), losses(t, dump)
			if _, ok := got[2]; ok || len(got) != 4 {
				t.Errorf("logged steps %v, want the resumed steps 3 to 6", got)
			}
			for step := 3; step <= 6; step++ {
				if want[step] == "" || want[step] != got[step] {
					t.Errorf("step %d: loss %s uninterrupted, %s after kill -9 and resume", step, want[step], got[step])
				}
			}
		})
	}
}

// waitGone waits until the process holding the lock file is gone.
func waitGone(t *testing.T, lock string) {
	t.Helper()
	raw, err := os.ReadFile(lock)
	if err != nil {
		return
	}
	var o struct{ PID int }
	if json.Unmarshal(raw, &o) != nil || o.PID <= 0 {
		return
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if syscall.Kill(o.PID, 0) != nil {
			return
		}
	}
	t.Fatalf("the killed run's process %d is still alive", o.PID)
}
