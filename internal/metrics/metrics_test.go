package metrics

import (
	"bytes"
	"encoding/json"
	"fmt"
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

func TestPlotRun(t *testing.T) {
	dir := t.TempDir()
	l, _ := Open(dir, &bytes.Buffer{}, 3)
	v := 2.0
	l.Log(Record{Step: 1, Loss: 4})
	l.Log(Record{Step: 2, Loss: 3, ValLoss: &v})
	l.Log(Record{Step: 3, Loss: 2.5})
	l.Close()
	path, err := PlotRun(dir, "test <run>")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	svg := string(raw)
	if !strings.HasPrefix(svg, "<svg") || strings.Count(svg, "<circle") != 1 || !strings.Contains(svg, "test &lt;run&gt;") {
		t.Fatalf("unexpected svg:\n%s", svg)
	}
	// Three points on the loss line, highest loss at the top.
	i := strings.Index(svg, `points="`)
	pts := strings.Fields(svg[i+8 : i+8+strings.Index(svg[i+8:], `"`)])
	if len(pts) != 3 {
		t.Fatalf("%d points, want 3", len(pts))
	}
	var y1, y3 float64
	fmt.Sscanf(strings.Split(pts[0], ",")[1], "%g", &y1)
	fmt.Sscanf(strings.Split(pts[2], ",")[1], "%g", &y3)
	if !(y1 < y3) {
		t.Errorf("loss 4 drawn at y=%v, loss 2.5 at y=%v; higher loss must be higher up", y1, y3)
	}
	if _, err := PlotRun(t.TempDir(), "x"); err == nil {
		t.Error("plotting a folder without metrics.jsonl must fail")
	}
}
