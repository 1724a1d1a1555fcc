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

// TestColor: the log line is coloured on a terminal, and not when
// disable_color_printing or NO_COLOR says so or the console is no
// terminal; the text without the escapes is the same either way.
func TestColor(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name    string
		opts    Options
		noColor string
		want    bool
	}{
		{"terminal", Options{Terminal: &yes}, "", true},
		{"terminal, disable_color_printing", Options{Terminal: &yes, DisableColor: true}, "", false},
		{"terminal, NO_COLOR", Options{Terminal: &yes}, "1", false},
		{"not a terminal", Options{Terminal: &no}, "", false},
		{"detected: a buffer", Options{}, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("NO_COLOR", tc.noColor)
			var out bytes.Buffer
			l, err := OpenWith("", &out, 0, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			v := 1.5
			r := Record{Step: 3, Loss: 2.25, ValLoss: &v}
			if err := l.Log(r); err != nil {
				t.Fatal(err)
			}
			got := out.String()
			if colored := strings.Contains(got, "\033["); colored != tc.want || l.Colored() != tc.want {
				t.Errorf("coloured = %v (Colored %v), want %v: %q", colored, l.Colored(), tc.want, got)
			}
			plain := got
			for _, code := range []string{ansiReset, ansiRed, ansiGreen, ansiYellow, ansiBlue, ansiMagenta, ansiCyan, ansiGray} {
				plain = strings.ReplaceAll(plain, code, "")
			}
			if plain != Line(r)+"\n" {
				t.Errorf("text %q, want %q", plain, Line(r)+"\n")
			}
		})
	}
}

// TestSaveForAllRanks: rank 0 writes metrics.jsonl; another rank writes
// metrics_rank<R>.jsonl only with SaveForAllRanks.
func TestSaveForAllRanks(t *testing.T) {
	tests := []struct {
		rank    int
		all     bool
		file    string // "" for none
		wantAny bool
	}{
		{0, false, "metrics.jsonl", true},
		{0, true, "metrics.jsonl", true},
		{1, false, "", false},
		{1, true, "metrics_rank1.jsonl", true},
		{3, true, "metrics_rank3.jsonl", true},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("rank%d_all%v", tc.rank, tc.all), func(t *testing.T) {
			dir := t.TempDir()
			l, err := OpenWith(dir, &bytes.Buffer{}, 2, Options{Rank: tc.rank, SaveForAllRanks: tc.all})
			if err != nil {
				t.Fatal(err)
			}
			l.Log(Record{Step: 1, Loss: float64(10 + tc.rank)})
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			entries, _ := os.ReadDir(dir)
			if !tc.wantAny {
				if len(entries) != 0 {
					t.Errorf("rank %d without save_for_all_ranks wrote %v", tc.rank, entries)
				}
				return
			}
			if len(entries) != 1 || entries[0].Name() != tc.file || RankFile(tc.rank) != tc.file {
				t.Fatalf("files %v, want only %s", entries, tc.file)
			}
			recs, err := ReadJSONL(filepath.Join(dir, tc.file))
			if err != nil || len(recs) != 1 || recs[0].Loss != float64(10+tc.rank) {
				t.Errorf("records %+v, %v", recs, err)
			}
		})
	}
}
