package main

import (
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// jsonLines decodes the lines of out that are JSON objects (the command
// under test writes its progress to the same buffer).
func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var rows []map[string]any
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		rows = append(rows, r)
	}
	return rows
}

// TestBenchGenerateJSON: titan bench generate --json prints one line per
// mode and length with the timing fields, and --plot writes a PNG of the
// sweep.
func TestBenchGenerateJSON(t *testing.T) {
	base := []string{"bench", "generate", "--recipe", "../../recipes/hyena_debug.toml", "--threads", "1", "--fft-tile", "16"}
	out, err := titan(t, append(base, "--length", "200", "--mode", "lazy,eager,flash", "--batch", "2", "--prompt", "7", "--json")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rows := jsonLines(t, out)
	if len(rows) != 3 {
		t.Fatalf("%d JSON lines, want 3:\n%s", len(rows), out)
	}
	for i, mode := range []string{"lazy", "eager", "flash"} {
		r := rows[i]
		if r["mode"] != mode || r["length"] != 200.0 || r["batch"] != 2.0 || r["prompt"] != 7.0 {
			t.Errorf("line %d: %v", i, r)
		}
		for _, k := range []string{"mixer_s", "other_s", "total_s", "p50_ms", "p99_ms", "tokens_per_s"} {
			if v, ok := r[k].(float64); !ok || v <= 0 {
				t.Errorf("%s: %s = %v", mode, k, r[k])
			}
		}
		if total, parts := r["total_s"].(float64), r["mixer_s"].(float64)+r["other_s"].(float64); total < parts*0.999 || total > parts*1.001 {
			t.Errorf("%s: total_s %g is not mixer_s + other_s = %g", mode, total, parts)
		}
	}

	plot := filepath.Join(t.TempDir(), "sweep.png")
	out, err = titan(t, append(base, "--lengths", "2^6,100,2^7", "--mode", "lazy,flash", "--slow-max", "100", "--plot", plot, "--json")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if rows := jsonLines(t, out); len(rows) != 5 { // lazy skipped at 128
		t.Errorf("%d JSON lines, want 5:\n%s", len(rows), out)
	}
	if !strings.Contains(out, "lazy L=128 skipped") {
		t.Errorf("the skipped run is not reported:\n%s", out)
	}
	f, err := os.Open(plot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("%s: %v", plot, err)
	}

	// The table form.
	out, err = titan(t, append(base, "--length", "100", "--mode", "lazy,flash")...)
	if err != nil || !strings.Contains(out, "flash vs lazy at L=100: mixer") {
		t.Fatalf("%v\n%s", err, out)
	}
}

// TestBenchGenerateRefusals: bad flags are refused with errors naming
// them.
func TestBenchGenerateRefusals(t *testing.T) {
	base := []string{"bench", "generate", "--recipe", "../../recipes/hyena_debug.toml"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown mode", []string{"--mode", "lazy,fast"}, "--mode"},
		{"beyond l_max", []string{"--length", "5000"}, "--length"},
		{"bad sweep", []string{"--lengths", "2^x"}, "--lengths"},
		{"prompt too long", []string{"--length", "10", "--prompt", "10"}, "--prompt"},
		{"llama recipe", []string{"--recipe", "../../recipes/llama3_debug.toml"}, "model.name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := titan(t, append(base, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v (output %q), want an error naming %q", err, out, tc.want)
			}
		})
	}
}

// TestGenerateHyena: titan generate runs on a hyena checkpoint trained
// for two steps, in every mode and for a batch, and refuses a --mode
// other than the default on a llama3 checkpoint.
func TestGenerateHyena(t *testing.T) {
	data := corpus(t)
	dump := t.TempDir()
	if out, err := titan(t, hyenaRun(dump, data, 2)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	ckpt := filepath.Join(dump, "checkpoint")
	gen := []string{"generate", "--checkpoint", ckpt, "--prompt", "the quick", "--max-new-tokens", "12", "--threads", "1"}
	for _, mode := range []string{"flash", "lazy", "eager"} {
		out, err := titan(t, append(gen, "--mode", mode, "--temperature", "0")...)
		if err != nil {
			t.Fatalf("--mode %s: %v\n%s", mode, err, out)
		}
		if !strings.HasPrefix(out, "the quick") || len(out) <= len("the quick\n") {
			t.Errorf("--mode %s printed %q", mode, out)
		}
	}
	out, err := titan(t, append(gen, "--batch", "3", "--seed", "5")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"--- sequence 0 (seed 5) ---\nthe quick", "--- sequence 1 (seed 6) ---\nthe quick", "--- sequence 2 (seed 7) ---\nthe quick"} {
		if !strings.Contains(out, want) {
			t.Errorf("--batch 3 output lacks %q:\n%s", want, out)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mode", "quick"}, "--mode"},
		{[]string{"--batch", "0"}, "--batch"},
		{[]string{"--max-new-tokens", "0"}, "--max-new-tokens 0"},
		{[]string{"--max-new-tokens", "-5"}, "--max-new-tokens -5"},
	} {
		if _, err := titan(t, append(gen, tc.args...)...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error naming %s", tc.args, err, tc.want)
		}
	}

	llama := t.TempDir()
	if out, err := titan(t, tinyRun(llama, data, 1)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	lgen := []string{"generate", "--checkpoint", filepath.Join(llama, "checkpoint"), "--prompt", "the", "--max-new-tokens", "3"}
	if _, err := titan(t, append(lgen, "--mode", "lazy")...); err == nil || !strings.Contains(err.Error(), "--mode") {
		t.Errorf("llama3 checkpoint with --mode lazy: got %v, want an error naming --mode", err)
	}
	if _, err := titan(t, append(lgen, "--batch", "2")...); err == nil || !strings.Contains(err.Error(), "--batch") {
		t.Errorf("llama3 checkpoint with --batch 2: got %v, want an error naming --batch", err)
	}
	if out, err := titan(t, append(lgen, "--mode", "flash")...); err != nil || !strings.HasPrefix(out, "the") {
		t.Errorf("llama3 checkpoint with the default --mode: %v, %q", err, out)
	}
}
