package metrics

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLogWritesConsoleAndJSONL(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	l, err := Open(dir, &out, 10)
	if err != nil {
		t.Fatal(err)
	}
	v := 2.5
	for _, r := range []Record{{Step: 1, Loss: 7.5, LR: 1e-3}, {Step: 2, Loss: 6.25, ValLoss: &v}} {
		if err := l.Log(r); err != nil {
			t.Fatal(err)
		}
	}
	l.Progress(3, 6) // not a terminal: no bar
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "loss  7.5000") || strings.Contains(out.String(), "[") {
		t.Errorf("console output:\n%s", out.String())
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "metrics.jsonl"))
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != 2 {
		t.Fatalf("metrics.jsonl has %d lines", len(lines))
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"step", "loss", "grad_norm", "lr", "tokens_per_sec", "tflops", "mfu", "mem_gib", "elapsed_s"} {
		if _, ok := m[k]; !ok {
			t.Errorf("metrics.jsonl lacks key %s", k)
		}
	}
	if PeakRSSGiB() <= 0 {
		t.Error("peak RSS unknown on Linux")
	}
}
