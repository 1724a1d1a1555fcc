package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/titan-go/titan/internal/runstore"
)

// TestMain lets the test binary stand in for titan when a launcher under
// test starts it as a worker.
func TestMain(m *testing.M) {
	if os.Getenv("TITANTEST_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Setenv("TITANTEST_RUN_MAIN", "1") // inherited by workers only
	// The tests' runs record in a temporary run store, never the user's.
	dir, err := os.MkdirTemp("", "titan-cmd-test-")
	if err != nil {
		panic(err)
	}
	os.Setenv(runstore.EnvDB, filepath.Join(dir, "runs.db"))
	os.Setenv("XDG_DATA_HOME", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// titan runs the CLI in-process and returns its output.
func titan(t *testing.T, args ...string) (string, error) {
	t.Helper()
	commandArgs = args
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

// corpus writes a small text dataset.
func corpus(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "corpus.txt")
	var b strings.Builder
	for i := 0; i < 400; i++ {
		b.WriteString("the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.\n")
	}
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// tinyRun is a recipe override set for a fast run on the tiny flavor.
func tinyRun(dump, data string, steps int) []string {
	return []string{"train", "--recipe", "../../recipes/llama3_debug.toml",
		"--set", "model.flavor=tiny_bench", "--set", "training.seq_len=32", "--set", "training.local_batch_size=2",
		"--set", "training.dataset=text", "--set", "training.dataset_path=" + data,
		"--set", "training.steps=" + itoa(steps), "--set", "metrics.log_freq=1",
		"--set", "lr_scheduler.warmup_steps=2", "--set", "validation.enable=false",
		"--set", "checkpoint.enable=true", "--set", "checkpoint.interval=10", "--set", "checkpoint.last_save_model_only=false",
		"--set", "job.dump_folder=" + dump}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// losses reads the loss column of metrics.jsonl, as written (exact text).
func losses(t *testing.T, dump string) map[int]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dump, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var r struct {
			Step int
			Loss json.Number
		}
		d := json.NewDecoder(strings.NewReader(line))
		d.UseNumber()
		if err := d.Decode(&r); err != nil {
			t.Fatal(err)
		}
		out[r.Step] = r.Loss.String()
	}
	return out
}

// TestResumeIsBitwise: 20 steps in one go equal 10 steps, a stop, and 10
// resumed steps, loss for loss, bit for bit. Then the trained model goes
// through eval → export → import → eval unchanged.
func TestResumeIsBitwise(t *testing.T) {
	data := corpus(t)
	whole, split := t.TempDir(), t.TempDir()
	if out, err := titan(t, tinyRun(whole, data, 20)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// The first half is the same job (same schedule over 20 steps) stopped at step 10.
	if out, err := titan(t, append(tinyRun(split, data, 10), "--set", "lr_scheduler.total_steps=20")...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err := titan(t, tinyRun(split, data, 20)...)
	if err != nil || !strings.Contains(out, "resumed from") {
		t.Fatalf("resume: %v\n%s", err, out)
	}
	a, b := losses(t, whole), losses(t, split)
	for step := 1; step <= 20; step++ {
		if a[step] == "" || a[step] != b[step] {
			t.Errorf("step %d: loss %s in one run, %s with a resume", step, a[step], b[step])
		}
	}
	first, _ := json.Number(a[1]).Float64()
	last, _ := json.Number(a[20]).Float64()
	if !(last < first) {
		t.Errorf("loss did not fall: %v -> %v", first, last)
	}

	// import → eval → export → import keeps the model exactly.
	ckpt := filepath.Join(whole, "checkpoint")
	hfDir, imported := t.TempDir(), filepath.Join(t.TempDir(), "ckpt")
	tokens := filepath.Join(t.TempDir(), "ids.txt")
	os.WriteFile(tokens, []byte("1 5 9 33 2 7\n4 4 4 4\n"), 0o644)
	evalA, err := titan(t, "eval", "--checkpoint", ckpt, "--tokens", tokens, "--json")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := titan(t, "checkpoint", "export", "--checkpoint", ckpt, "--hf", hfDir); err != nil {
		t.Fatal(err)
	}
	if _, err := titan(t, "checkpoint", "import", "--hf", hfDir, "--output", imported); err != nil {
		t.Fatal(err)
	}
	evalB, err := titan(t, "eval", "--checkpoint", imported, "--tokens", tokens, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var ra, rb struct {
		Loss   float64
		Tokens int
	}
	json.Unmarshal([]byte(evalA), &ra)
	json.Unmarshal([]byte(evalB), &rb)
	if ra.Tokens != 8 || ra != rb {
		t.Errorf("eval before export %s, after import %s", evalA, evalB)
	}
	if out, err := titan(t, "generate", "--checkpoint", imported, "--prompt", "the quick", "--max-new-tokens", "8", "--temperature", "0"); err != nil || !strings.HasPrefix(out, "the quick") {
		t.Errorf("generate: %v\n%s", err, out)
	}
}

// TestBadInput: each mistake gives an error that names it.
func TestBadInput(t *testing.T) {
	data := corpus(t)
	empty := filepath.Join(t.TempDir(), "empty.txt")
	os.WriteFile(empty, nil, 0o644)
	junkTok := filepath.Join(t.TempDir(), "tok.model")
	os.WriteFile(junkTok, []byte("this is not a tokenizer\n"), 0o644)
	run := func(extra ...string) []string { return append(tinyRun(t.TempDir(), data, 1), extra...) }
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown key", run("--set", "training.stesp=3"), "training.steps"},
		{"wrong type", run("--set", "training.steps=ten"), "training.steps"},
		{"missing dataset", run("--set", "training.dataset_path=/nonexistent/data.txt"), "/nonexistent/data.txt"},
		{"empty dataset", run("--set", "training.dataset_path="+empty), "empty"},
		{"unreadable tokenizer", run("--set", "model.tokenizer_path="+junkTok), "tok.model"},
		{"seq_len beyond the model's filters", []string{"train", "--recipe", "../../recipes/hyena_debug.toml", "--set", "training.seq_len=100000", "--set", "job.dump_folder=" + t.TempDir()}, "l_max"},
		{"unknown flavor", run("--set", "model.flavor=9B"), "flavor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := titan(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v (output %q), want an error naming %q", err, out, tc.want)
			}
		})
	}
}

// TestTamperedCheckpointIsRefused: a flipped byte in the weights is caught.
func TestTamperedCheckpointIsRefused(t *testing.T) {
	dump := t.TempDir()
	if out, err := titan(t, tinyRun(dump, corpus(t), 2)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	step := filepath.Join(dump, "checkpoint", "step-2")
	p := filepath.Join(step, "data-00000.bin")
	b, _ := os.ReadFile(p)
	b[1000] ^= 1
	os.WriteFile(p, b, 0o644)
	tokens := filepath.Join(t.TempDir(), "ids.txt")
	os.WriteFile(tokens, []byte("1 2 3\n"), 0o644)
	if _, err := titan(t, "eval", "--checkpoint", step, "--tokens", tokens); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("eval of a tampered checkpoint: %v", err)
	}
	os.Truncate(p, 100)
	if _, err := titan(t, tinyRun(dump, corpus(t), 4)...); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("resume from a truncated checkpoint: %v", err)
	}
}

// TestEveryCommandHasExamples: help text with examples on every command.
func TestEveryCommandHasExamples(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Name() != "help" && c.Name() != "completion" && !c.Hidden {
			if c.Example == "" {
				t.Errorf("titan %s has no examples", c.CommandPath())
			}
			for _, sub := range c.Commands() {
				walk(sub)
			}
		}
	}
	root := newRootCmd()
	for _, c := range root.Commands() {
		walk(c)
	}
}
