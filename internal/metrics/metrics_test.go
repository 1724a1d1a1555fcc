package metrics

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"math"
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

// svgLines reads the data-points of loss.svg's polylines by id (step,
// loss) and counts its circles. It checks that each polyline's drawn
// points are its data points placed on the axes that the tick lines
// show (within 0.01 pixel).
func svgLines(t *testing.T, path string) (map[string][][2]float64, int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	parse := func(id, pts string) [][2]float64 {
		var out [][2]float64
		for _, p := range strings.Fields(pts) {
			var xy [2]float64
			if _, err := fmt.Sscanf(strings.Replace(p, ",", " ", 1), "%g %g", &xy[0], &xy[1]); err != nil {
				t.Fatalf("polyline %s point %q: %v", id, p, err)
			}
			out = append(out, xy)
		}
		return out
	}
	data, pix := map[string][][2]float64{}, map[string][][2]float64{}
	var xt, yt [][2]float64 // (value, pixel) of the tick lines
	circles := 0
	dec := xml.NewDecoder(f)
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", path, err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		attr := map[string]string{}
		for _, a := range se.Attr {
			attr[a.Name.Local] = a.Value
		}
		switch se.Name.Local {
		case "circle":
			circles++
		case "line":
			var v, x, y float64
			fmt.Sscan(attr["data-value"], &v)
			fmt.Sscan(attr["x1"], &x)
			fmt.Sscan(attr["y1"], &y)
			switch attr["class"] {
			case "xtick":
				xt = append(xt, [2]float64{v, x})
			case "ytick":
				yt = append(yt, [2]float64{v, y})
			}
		case "polyline":
			id := attr["id"]
			data[id], pix[id] = parse(id, attr["data-points"]), parse(id, attr["points"])
		}
	}
	if len(xt) < 2 || len(yt) < 2 {
		t.Fatalf("%s: %d x ticks, %d y ticks", path, len(xt), len(yt))
	}
	axis := func(ticks [][2]float64, v float64) float64 {
		a, b := ticks[0], ticks[len(ticks)-1]
		return a[1] + (v-a[0])*(b[1]-a[1])/(b[0]-a[0])
	}
	for id, d := range data {
		if len(pix[id]) != len(d) {
			t.Fatalf("polyline %s: %d points drawn, %d data points", id, len(pix[id]), len(d))
		}
		for i, p := range d {
			if q := pix[id][i]; math.Abs(q[0]-axis(xt, p[0])) > 0.01 || math.Abs(q[1]-axis(yt, p[1])) > 0.01 {
				t.Errorf("polyline %s point %d: drawn at %v, data %v belongs at (%.3f, %.3f)", id, i, q, p, axis(xt, p[0]), axis(yt, p[1]))
			}
		}
	}
	return data, circles
}

// TestPlotRun: loss.svg draws every step's loss (Step), not only the
// logged ones, its moving average and the validation loss as a line with
// a marker per point; a resumed run appends and the latest entry of a
// step wins; a dump without loss_steps.jsonl draws the logged losses.
func TestPlotRun(t *testing.T) {
	dir := t.TempDir()
	losses := map[int]float64{}
	val := map[int]float64{}
	// run 1: steps 1..7 (logged every 3rd), then "resumed" from step 4
	// with other losses up to step 9
	run := func(from, to int, off float64) {
		l, err := Open(dir, &bytes.Buffer{}, 9)
		if err != nil {
			t.Fatal(err)
		}
		sum, n := 0.0, 0
		for s := from; s <= to; s++ {
			loss := 10/float64(s) + off
			losses[s] = loss
			if err := l.Step(s, loss); err != nil {
				t.Fatal(err)
			}
			sum, n = sum+loss, n+1
			if s%3 == 0 {
				v := loss + 0.5
				val[s] = v
				if err := l.Log(Record{Step: s, Loss: sum / float64(n), ValLoss: &v}); err != nil {
					t.Fatal(err)
				}
				sum, n = 0, 0
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	run(1, 7, 0)
	run(4, 9, 0.125)
	path, err := PlotRun(dir, "test <run>")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	if !strings.Contains(string(raw), "test &lt;run&gt;") {
		t.Error("title missing")
	}
	lines, circles := svgLines(t, path)
	var want, wantVal [][2]float64
	for s := 1; s <= 9; s++ {
		want = append(want, [2]float64{float64(s), losses[s]})
		if v, ok := val[s]; ok {
			wantVal = append(wantVal, [2]float64{float64(s), v})
		}
	}
	if fmt.Sprint(lines[LossRawID]) != fmt.Sprint(want) {
		t.Errorf("raw line %v, want %v", lines[LossRawID], want)
	}
	if fmt.Sprint(lines[LossValID]) != fmt.Sprint(wantVal) || circles != len(wantVal)+1 { // +1: the legend's marker
		t.Errorf("validation line %v (%d circles), want %v", lines[LossValID], circles, wantVal)
	}
	ema := losses[1]
	for i, p := range lines[LossSmoothID] {
		if i > 0 {
			ema = 0.9*ema + 0.1*losses[i+1]
		}
		if p[0] != float64(i+1) || math.Abs(p[1]-ema) > 1e-12 {
			t.Errorf("smoothed point %d: %v, want (%d, %v)", i, p, i+1, ema)
		}
	}
	if len(lines[LossSmoothID]) != 9 {
		t.Errorf("smoothed line has %d points, want 9", len(lines[LossSmoothID]))
	}

	// Without loss_steps.jsonl (an older titan's dump): the logged losses.
	if err := os.Remove(filepath.Join(dir, StepLossFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := PlotRun(dir, "old"); err != nil {
		t.Fatal(err)
	}
	lines, _ = svgLines(t, path)
	if got := lines[LossRawID]; len(got) != 3 || got[0][0] != 3 || got[2][0] != 9 {
		t.Errorf("fallback line %v, want the logged steps 3, 6, 9", got)
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
			want := []string{tc.file}
			if tc.rank == 0 {
				want = []string{StepLossFile, tc.file} // rank 0 keeps every step's loss too
			}
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			if fmt.Sprint(names) != fmt.Sprint(want) || RankFile(tc.rank) != tc.file {
				t.Fatalf("files %v, want %v", names, want)
			}
			recs, err := ReadJSONL(filepath.Join(dir, tc.file))
			if err != nil || len(recs) != 1 || recs[0].Loss != float64(10+tc.rank) {
				t.Errorf("records %+v, %v", recs, err)
			}
		})
	}
}
