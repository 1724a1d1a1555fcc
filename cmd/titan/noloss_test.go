package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/hf"
	"github.com/titan-go/titan/internal/model/llama"
)

// set appends --set key=value pairs to args.
func set(args []string, kv ...string) []string {
	for _, s := range kv {
		args = append(args, "--set", s)
	}
	return args
}

// kindOf is "full" or "model-only" for the step folder of a dump.
func kindOf(t *testing.T, dump string, step int) string {
	t.Helper()
	r, err := checkpoint.Open(checkpoint.StepDir(filepath.Join(dump, "checkpoint"), step))
	if err != nil {
		t.Fatal(err)
	}
	return r.Meta.Kind()
}

// TestFinishedRunContinuesExactly: a run that finished at step 10
// (interval 10, last_save_model_only=true) and is started again with
// training.steps=20 resumes the full state of step 10: its losses of
// steps 11–20 are bitwise those of an uninterrupted 20-step run. (On
// main the final model-only save replaced the full state of step 10 and
// the second run went on with a fresh optimizer and data loader.)
func TestFinishedRunContinuesExactly(t *testing.T) {
	data := corpus(t)
	base := func(dump string, steps int) []string {
		return set(tinyRun(dump, data, steps), "checkpoint.last_save_model_only=true", "lr_scheduler.total_steps=20")
	}
	whole, split := t.TempDir(), t.TempDir()
	if out, err := titan(t, base(whole, 20)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := titan(t, base(split, 10)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if k := kindOf(t, split, 10); k != "full" {
		t.Fatalf("the final save of step 10 (an interval step) is %s, want full", k)
	}
	out, err := titan(t, base(split, 20)...)
	if err != nil || !strings.Contains(out, "resumed from "+filepath.Join(split, "checkpoint", "step-10")) {
		t.Fatalf("continue: %v\n%s", err, out)
	}
	a, b := losses(t, whole), losses(t, split)
	for step := 11; step <= 20; step++ {
		if a[step] == "" || a[step] != b[step] {
			t.Errorf("step %d: loss %s uninterrupted, %s continued", step, a[step], b[step])
		}
	}
}

// TestModelOnlyCheckpointsNeedAsking: a dump folder whose newest
// checkpoints are model-only resumes from the newest full one and says
// so; with no full one it is an error until checkpoint.initial_load_path
// asks for the weights, which the log then reports; checkpoint.load_step
// naming a model-only checkpoint is an error naming it. (That
// keep_latest_k keeps the newest full checkpoint behind newer model-only
// ones is TestPurgeKeepsNewestFull of internal/checkpoint.)
func TestModelOnlyCheckpointsNeedAsking(t *testing.T) {
	data := corpus(t)
	t.Run("only model-only", func(t *testing.T) {
		dump := t.TempDir()
		if out, err := titan(t, set(tinyRun(dump, data, 3), "checkpoint.last_save_model_only=true")...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		step3 := filepath.Join(dump, "checkpoint", "step-3")
		_, err := titan(t, set(tinyRun(dump, data, 6), "checkpoint.last_save_model_only=true")...)
		if err == nil || !strings.Contains(err.Error(), "only model-only checkpoints (step-3)") || !strings.Contains(err.Error(), "initial_load_path="+step3) {
			t.Fatalf("resume from model-only alone: %v", err)
		}
		other := t.TempDir()
		out, err := titan(t, set(tinyRun(other, data, 2), "checkpoint.initial_load_path="+step3)...)
		if err != nil || !strings.Contains(out, "initial weights from "+step3+" (model-only checkpoint of step 3, loaded model-only") {
			t.Fatalf("initial_load_path: %v\n%s", err, out)
		}
	})
	t.Run("load_step and keep_latest_k", func(t *testing.T) {
		dump := t.TempDir()
		if out, err := titan(t, set(tinyRun(dump, data, 5), "checkpoint.interval=2", "checkpoint.keep_latest_k=2", "checkpoint.last_save_model_only=true")...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		ents, _ := os.ReadDir(filepath.Join(dump, "checkpoint"))
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if fmt.Sprint(names) != "[step-4 step-5]" {
			t.Fatalf("keep_latest_k=2 left %v, want [step-4 step-5]", names)
		}
		step5 := filepath.Join(dump, "checkpoint", "step-5")
		_, err := titan(t, set(tinyRun(dump, data, 8), "checkpoint.load_step=5")...)
		if err == nil || !strings.Contains(err.Error(), "load_step 5: "+step5+" is a model-only checkpoint") {
			t.Fatalf("load_step of a model-only checkpoint: %v", err)
		}
		out, err := titan(t, set(tinyRun(dump, data, 6), "checkpoint.last_save_model_only=true")...)
		if err != nil || !strings.Contains(out, "step-5 is model-only (no training state); resuming from the full state of "+filepath.Join(dump, "checkpoint", "step-4")) {
			t.Fatalf("resume past a newer model-only checkpoint: %v\n%s", err, out)
		}
	})
}

// TestDamagedStepFolderIsReported: a step folder that is incomplete or
// corrupt is named in a warning with the reason and skipped (the run
// resumes from the previous intact one); with none left the run stops
// with an error naming it instead of starting again from step 1.
func TestDamagedStepFolderIsReported(t *testing.T) {
	data := corpus(t)
	for _, tc := range []struct {
		name   string
		damage func(dir string)
		want   string
	}{
		{"metadata missing", func(d string) { os.Remove(filepath.Join(d, "metadata.json")) }, "metadata.json is missing"},
		{"bad checksum", func(d string) {
			p := filepath.Join(d, "data-00000.bin")
			b, _ := os.ReadFile(p)
			b[len(b)/2] ^= 1
			os.WriteFile(p, b, 0o644)
		}, "checksum mismatch"},
		{"missing shard", func(d string) { os.Remove(filepath.Join(d, "data-00000.bin")) }, "missing shard file data-00000.bin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dump := t.TempDir()
			if out, err := titan(t, set(tinyRun(dump, data, 4), "checkpoint.interval=2")...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			ck := filepath.Join(dump, "checkpoint")
			tc.damage(checkpoint.StepDir(ck, 4))
			out, err := titan(t, tinyRun(dump, data, 5)...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			warn := "warning: skipping checkpoint " + filepath.Join(ck, "step-4")
			if !strings.Contains(out, warn) || !strings.Contains(out, tc.want) || !strings.Contains(out, "resumed from "+filepath.Join(ck, "step-2")) {
				t.Fatalf("want %q with %q and a resume from step-2:\n%s", warn, tc.want, out)
			}
			// With every one damaged, nothing is discarded.
			infos, _, _ := checkpoint.Scan(ck)
			if len(infos) == 0 {
				t.Fatal("no checkpoint after the resumed run")
			}
			for _, in := range infos {
				if r, err := checkpoint.Open(in.Dir); err == nil && r.Verify() == nil {
					tc.damage(in.Dir)
				}
			}
			out, err = titan(t, tinyRun(dump, data, 6)...)
			if err == nil || !strings.Contains(err.Error(), "no intact checkpoint") || !strings.Contains(err.Error(), infos[0].Dir) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("all damaged: %v\n%s", err, out)
			}
		})
	}
}

// TestSecondRunOnDumpFolderIsRefused: a run on a dump folder another
// live process holds is refused with the holder's host and pid; a lock
// left by a process that is gone is taken over; a run releases its lock.
func TestSecondRunOnDumpFolderIsRefused(t *testing.T) {
	data := corpus(t)
	dump := t.TempDir()
	host, _ := os.Hostname()
	lock := filepath.Join(dump, checkpoint.LockFile)
	b, _ := json.Marshal(checkpoint.Owner{Host: host, PID: os.Getppid()})
	os.WriteFile(lock, b, 0o644)
	_, err := titan(t, tinyRun(dump, data, 2)...)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("in use by another run (pid %d on host %s", os.Getppid(), host)) {
		t.Fatalf("second run: %v", err)
	}
	// In one process too: the first trainer holds it until it closes.
	os.Remove(lock)
	l, err := checkpoint.Acquire(dump)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := titan(t, tinyRun(dump, data, 2)...); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("pid %d on host %s", os.Getpid(), host)) {
		t.Fatalf("second run in this process: %v", err)
	}
	l.Release()
	// A lock of a process gone from this host is stale.
	b, _ = json.Marshal(checkpoint.Owner{Host: host, PID: 1 << 22})
	os.WriteFile(lock, b, 0o644)
	if out, err := titan(t, tinyRun(dump, data, 2)...); err != nil {
		t.Fatalf("stale lock: %v\n%s", err, out)
	}
	if _, err := os.Stat(lock); !os.IsNotExist(err) {
		t.Errorf("lock file left after the run: %v", err)
	}
}

// TestCheckpointInspect: inspect shows whether a checkpoint is full or
// model-only, its step, files, tensors and sizes, lists the step folders
// of a checkpoint folder (naming damaged ones), and verifies checksums.
func TestCheckpointInspect(t *testing.T) {
	dump := t.TempDir()
	if out, err := titan(t, set(tinyRun(dump, corpus(t), 3), "checkpoint.interval=2", "checkpoint.last_save_model_only=true")...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	ck := filepath.Join(dump, "checkpoint")
	out, err := titan(t, "checkpoint", "inspect", ck)
	for _, want := range []string{"step-2       full", "step-3       model-only", "step-3: step 3", "format version 2, committed", "contents: model-only", "saved under: 1 rank(s): pp 1 × dp_replicate 1 × dp_shard 1 × cp 1 × tp 1", "rank 0     data-00000.bin", "model/tok_embeddings.weight", "[2000 256]", "checksums: ok"} {
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("inspect %s: %v; want %q in\n%s", ck, err, want, out)
		}
	}
	step2 := filepath.Join(ck, "step-2")
	if out, err := titan(t, "checkpoint", "inspect", step2); err != nil || !strings.Contains(out, "contents: full") || !strings.Contains(out, checkpoint.TrainStateBlob) {
		t.Fatalf("inspect %s: %v\n%s", step2, err, out)
	}
	p := filepath.Join(step2, "data-00000.bin")
	b, _ := os.ReadFile(p)
	b[len(b)-3] ^= 1
	os.WriteFile(p, b, 0o644)
	if _, err := titan(t, "checkpoint", "inspect", step2); err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Fatalf("inspect of a tampered checkpoint: %v", err)
	}
	if out, err := titan(t, "checkpoint", "inspect", step2, "--verify=false"); err != nil || !strings.Contains(out, "not verified") {
		t.Fatalf("inspect --verify=false: %v\n%s", err, out)
	}
	os.Remove(filepath.Join(step2, checkpoint.CommitMarker))
	if out, err := titan(t, "checkpoint", "inspect", ck); err != nil || !strings.Contains(out, "step-2       damaged: checkpoint: "+step2+" has no commit marker") {
		t.Fatalf("inspect with an uncommitted step folder: %v\n%s", err, out)
	}
	os.Remove(filepath.Join(step2, "metadata.json"))
	if out, err := titan(t, "checkpoint", "inspect", ck); err != nil || !strings.Contains(out, "step-2       damaged: metadata.json is missing") {
		t.Fatalf("inspect with a damaged step folder: %v\n%s", err, out)
	}
	// A checkpoint of four ranks (FSDP2 × TP2) shows its layout and each
	// rank's shard file.
	dump4 := t.TempDir()
	if out, err := titan(t, append(set(tinyRun(dump4, corpus(t), 2), "checkpoint.last_save_model_only=false", "parallelism.tensor_parallel_degree=2", "parallelism.data_parallel_shard_degree=2", "training.threads=1", "training.local_batch_size=1"), "--nproc", "4")...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err = titan(t, "checkpoint", "inspect", filepath.Join(dump4, "checkpoint"))
	for _, want := range []string{"saved under: 4 rank(s): pp 1 × dp_replicate 1 × dp_shard 2 × cp 1 × tp 2", "shards: 4 rank(s)", "rank 3     data-00003.bin", "contents: full", "checksums: ok"} {
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("inspect of the 4-rank checkpoint: %v; want %q in\n%s", err, want, out)
		}
	}
}

// TestImportHostileHF: titan checkpoint import --hf of a config.json
// with vocab_size 10^12 or num_hidden_layers 10^9 is an error naming the
// field (on main: a makeslice panic, and an allocation until killed).
func TestImportHostileHF(t *testing.T) {
	cfg := llama.Config{Dim: 16, NLayers: 1, NHeads: 2, VocabSize: 32, MultipleOf: 16, NormEps: 1e-5, RoPETheta: 10000, MaxSeqLen: 64}
	src := t.TempDir()
	if err := hf.Export(src, cfg, make([]float32, cfg.NumParams()), "float32", hf.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ key, value, want string }{
		{"vocab_size", "1000000000000", "vocab_size 1000000000000 is out of range"},
		{"num_hidden_layers", "1000000000", "num_hidden_layers 1000000000 is out of range"},
	} {
		t.Run(tc.key, func(t *testing.T) {
			var mc map[string]any
			raw, _ := os.ReadFile(filepath.Join(src, hf.ConfigFile))
			json.Unmarshal(raw, &mc)
			mc[tc.key] = json.Number(tc.value)
			raw, _ = json.Marshal(mc)
			dir := t.TempDir()
			st, _ := os.ReadFile(filepath.Join(src, "model.safetensors"))
			os.WriteFile(filepath.Join(dir, "model.safetensors"), st, 0o644)
			os.WriteFile(filepath.Join(dir, hf.ConfigFile), raw, 0o644)
			_, err := titan(t, "checkpoint", "import", "--hf", dir, "--output", filepath.Join(t.TempDir(), "ck"))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), hf.ConfigFile) {
				t.Fatalf("got %v, want an error naming %s and %q", err, hf.ConfigFile, tc.want)
			}
		})
	}
}

// TestCorruptShardOfOneRank: under FSDP2 each rank reads only the chunks
// of its shards, so damage in the chunks rank 1 wrote is found by rank 1
// alone. The ranks agree on it: both skip step-4, naming it, resume from
// step-2, and train on bit for bit as an uninterrupted run.
func TestCorruptShardOfOneRank(t *testing.T) {
	data := corpus(t)
	ref := t.TempDir()
	if out, err := titan(t, append(set(tinyRun(ref, data, 6), "checkpoint.interval=2"), "--nproc", "2")...); err != nil {
		t.Fatalf("uninterrupted: %v\n%s", err, out)
	}
	dump := t.TempDir()
	if out, err := titan(t, append(set(tinyRun(dump, data, 4), "checkpoint.interval=2"), "--nproc", "2")...); err != nil {
		t.Fatalf("first 4 steps: %v\n%s", err, out)
	}
	ck := filepath.Join(dump, "checkpoint")
	p := filepath.Join(checkpoint.StepDir(ck, 4), "data-00001.bin")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/3] ^= 1
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := titan(t, append(set(tinyRun(dump, data, 6), "checkpoint.interval=2"), "--nproc", "2")...)
	if err != nil {
		t.Fatalf("resumed: %v\n%s", err, out)
	}
	for _, want := range []string{
		"rank 1: cannot load checkpoint " + checkpoint.StepDir(ck, 4),
		"checksum mismatch",
		"warning: skipping checkpoint " + checkpoint.StepDir(ck, 4) + ": 1 of 2 ranks could not load",
		"resumed from " + checkpoint.StepDir(ck, 2),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the resumed run's output lacks %q:\n%s", want, out)
		}
	}
	want, got := losses(t, ref), losses(t, dump)
	for s := 3; s <= 6; s++ {
		if got[s] != want[s] || got[s] == "" {
			t.Errorf("step %d: loss %s after resuming from step-2, %s uninterrupted", s, got[s], want[s])
		}
	}
}
