package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hyenaRun is a short training run of the hyena debug flavor on data.
func hyenaRun(dump, data string, steps int) []string {
	return []string{"train", "--recipe", "../../recipes/hyena_debug.toml",
		"--set", "model.flavor=debug", "--set", "training.seq_len=32", "--set", "training.local_batch_size=4",
		"--set", "training.dataset=text", "--set", "training.dataset_path=" + data,
		"--set", "training.steps=" + itoa(steps), "--set", "metrics.log_freq=1",
		"--set", "lr_scheduler.warmup_steps=2", "--set", "validation.enable=false",
		"--set", "checkpoint.enable=true", "--set", "checkpoint.interval=100", "--set", "checkpoint.last_save_model_only=true",
		"--set", "job.dump_folder=" + dump}
}

// TestHyenaParallelismMatchesOneProcess: the hyena family trains under
// DDP2, FSDP2 (resharding after forward or not), PP2 (1F1B, ZBV) and
// PP2×FSDP2 of the one engine like one process with the same global batch: losses and
// gradient norms within 1e-5 relative at every step, parameters within
// 1e-5 (L2 relative), with clipping on (max_norm 1) and off.
func TestHyenaParallelismMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	const steps = 6
	data := corpus(t)
	for _, clip := range []string{"1.0", "1e9"} {
		one := t.TempDir()
		if out, err := titan(t, append(hyenaRun(one, data, steps), "--set", "training.max_norm="+clip)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, c := range []struct {
			name string
			args []string
		}{
			{"DDP2", []string{"--nproc", "2", "--set", "training.local_batch_size=2", "--set", "parallelism.data_parallel_replicate_degree=2", "--set", "parallelism.data_parallel_shard_degree=1"}},
			{"FSDP2", []string{"--nproc", "2", "--set", "training.local_batch_size=2", "--set", "parallelism.fsdp_reshard_after_forward=always"}},
			{"FSDP2 never", []string{"--nproc", "2", "--set", "training.local_batch_size=2", "--set", "parallelism.fsdp_reshard_after_forward=never"}},
			// The head, on the last stage, is tied to the first stage's
			// embedding: the engine keeps the copy in step.
			{"PP2 1F1B", []string{"--nproc", "2", "--set", "parallelism.pipeline_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=1"}},
			{"PP2 ZBV", []string{"--nproc", "2", "--set", "parallelism.pipeline_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=1", "--set", "parallelism.pipeline_parallel_schedule=ZBVZeroBubble"}},
			{"PP2xFSDP2 Interleaved1F1B", []string{"--nproc", "4", "--set", "training.local_batch_size=2", "--set", "parallelism.pipeline_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=2", "--set", "parallelism.pipeline_parallel_schedule=Interleaved1F1B", "--set", "parallelism.fsdp_reshard_after_forward=always"}},
		} {
			name := c.name + " max_norm " + clip
			t.Run(name, func(t *testing.T) {
				dump := t.TempDir()
				args := append(hyenaRun(dump, data, steps), "--set", "training.max_norm="+clip)
				if out, err := titan(t, append(args, c.args...)...); err != nil {
					t.Fatalf("%v\n%s", err, out)
				}
				checkParity(t, name, one, dump, steps)
			})
		}
	}
}

// TestBenchRecipes: `titan bench recipes` trains a Llama and a Hyena
// recipe side by side and prints one JSON line per recipe with the
// figures of its own metrics, and the plots.
func TestBenchRecipes(t *testing.T) {
	if testing.Short() {
		t.Skip("training runs")
	}
	data := corpus(t)
	dir := t.TempDir()
	out, err := titan(t, "bench", "recipes", "../../recipes/llama3_debug.toml", "../../recipes/hyena_debug.toml",
		"--steps", "3", "--json", "--out", dir, "--plot", filepath.Join(dir, "cmp.png"),
		"--set", "training.seq_len=32", "--set", "training.local_batch_size=2", "--set", "validation.enable=false",
		"--set", "training.dataset=text", "--set", "training.dataset_path="+data, "--set", "checkpoint.interval=2",
		"--set", "model.flavor=debug")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			lines = append(lines, m)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("want 2 JSON lines, got:\n%s", out)
	}
	for i, m := range lines {
		if id, _ := m["run_id"].(string); id == "" {
			t.Errorf("line %d: the run was not recorded in the run store: %v", i, m)
		}
		for _, k := range []string{"recipe", "tokens_per_sec", "mfu", "mem_gib", "final_loss", "loss_at_equal_tokens", "first_checkpoint_s"} {
			if _, ok := m[k]; !ok {
				t.Errorf("line %d lacks %s: %v", i, k, m)
			}
		}
		dump := filepath.Join(dir, "run-"+itoa(i))
		if got, want := m["final_loss"].(float64), metricsColumn(t, dump, "loss")[3]; got != want {
			t.Errorf("%s: final_loss %v, its metrics say %v", m["recipe"], got, want)
		}
		if s := m["first_checkpoint_s"].(float64); s <= 0 {
			t.Errorf("%s: first checkpoint after %v s", m["recipe"], s)
		}
	}
	for _, f := range []string{"cmp-throughput.png", "cmp-loss.png"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Size() == 0 {
			t.Errorf("plot %s: %v", f, err)
		}
	}
}

// TestBenchRecipesChecksEveryRecipeFirst: a comparison whose last recipe
// cannot run on its workers fails naming that recipe before any recipe
// trains.
func TestBenchRecipesChecksEveryRecipeFirst(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("[parallelism]\ntensor_parallel_degree = 3\ndata_parallel_shard_degree = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := titan(t, "bench", "recipes", "../../recipes/llama3_debug.toml", bad, "--steps", "3", "--nproc", "2", "--out", dir)
	if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "tp 3") {
		t.Fatalf("got %v, want an error naming %s and its layout\n%s", err, bad, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "run-0")); !os.IsNotExist(err) {
		t.Errorf("the first recipe trained before the last was checked (%s: %v)", filepath.Join(dir, "run-0"), err)
	}
}
