package main

import (
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/metrics"
)

// polylines reads loss.svg's polylines by id: their points in data
// coordinates (step, loss) as written (metrics.PlotLoss).
func polylines(t *testing.T, path string) map[string][][2]float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][][2]float64{}
	dec := xml.NewDecoder(f)
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name.Local != "polyline" {
			continue
		}
		var id, pts string
		for _, a := range se.Attr {
			if a.Name.Local == "id" {
				id = a.Value
			}
			if a.Name.Local == "data-points" {
				pts = a.Value
			}
		}
		for _, p := range strings.Fields(pts) {
			x, y, _ := strings.Cut(p, ",")
			fx, err1 := strconv.ParseFloat(x, 64)
			fy, err2 := strconv.ParseFloat(y, 64)
			if err1 != nil || err2 != nil {
				t.Fatalf("%s: polyline %s point %q", path, id, p)
			}
			out[id] = append(out[id], [2]float64{fx, fy})
		}
	}
}

// TestLossPlotEveryStep: with metrics.log_freq=5 a 12-step run's loss.svg
// draws all 12 steps' losses, equal to those a run with log_freq=1 and
// the same seed logs, and its validation line the val_loss of
// metrics.jsonl; a run stopped at step 6 and resumed from step 5 to 12
// draws the same 12 losses, step 6 once. The console prints one line per log step.
func TestLossPlotEveryStep(t *testing.T) {
	data := corpus(t)
	run := func(dump string, steps, logFreq int) string {
		t.Helper()
		out, err := titan(t, set(tinyRun(dump, data, steps), "metrics.log_freq="+itoa(logFreq), "lr_scheduler.total_steps=12", "checkpoint.interval=5", "validation.enable=true",
			"validation.freq=4", "validation.steps=1", "validation.dataset=text", "validation.dataset_path="+data)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return out
	}
	ref := t.TempDir()
	run(ref, 12, 1)
	perStep := jsonlRecords(t, filepath.Join(ref, "metrics.jsonl"))
	var want [][2]float64
	for s := 1; s <= 12; s++ {
		want = append(want, [2]float64{float64(s), perStep[s]["loss"]})
	}

	dump := t.TempDir()
	out := run(dump, 12, 5)
	var logged []int
	for _, m := range regexp.MustCompile(`(?m)^step\s+(\d+)\s+loss `).FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		logged = append(logged, n)
	}
	if fmt.Sprint(logged) != "[1 4 5 8 10 12]" { // log_freq 5, the first and last step, validation every 4
		t.Errorf("console log lines at steps %v, want one each at [1 4 5 8 10 12]:\n%s", logged, out)
	}
	recs := jsonlRecords(t, filepath.Join(dump, "metrics.jsonl"))
	var wantVal [][2]float64
	var steps []int
	for s := range recs {
		steps = append(steps, s)
	}
	sort.Ints(steps)
	for _, s := range steps {
		if v, ok := recs[s]["val_loss"]; ok {
			wantVal = append(wantVal, [2]float64{float64(s), v})
		}
	}
	lines := polylines(t, filepath.Join(dump, "loss.svg"))
	if fmt.Sprint(lines[metrics.LossRawID]) != fmt.Sprint(want) {
		t.Errorf("loss.svg raw line %v,\nwant the log_freq=1 run's %v", lines[metrics.LossRawID], want)
	}
	if len(wantVal) != 3 || fmt.Sprint(lines[metrics.LossValID]) != fmt.Sprint(wantVal) {
		t.Errorf("loss.svg validation line %v, metrics.jsonl val_loss %v", lines[metrics.LossValID], wantVal)
	}
	if len(lines[metrics.LossSmoothID]) != 12 {
		t.Errorf("smoothed line of %d points, want 12", len(lines[metrics.LossSmoothID]))
	}
	t.Logf("raw %v\nval %v", lines[metrics.LossRawID], lines[metrics.LossValID])

	// Stopped after step 6, the checkpoint of step 6 lost: the resumed run
	// trains step 6 again from step 5's; its record replaces the first.
	resumed := t.TempDir()
	run(resumed, 6, 5)
	if err := os.RemoveAll(checkpoint.StepDir(filepath.Join(resumed, "checkpoint"), 6)); err != nil {
		t.Fatal(err)
	}
	if out := run(resumed, 12, 5); !strings.Contains(out, "resumed from "+checkpoint.StepDir(filepath.Join(resumed, "checkpoint"), 5)) {
		t.Fatalf("the second run did not resume:\n%s", out)
	}
	if sl, err := metrics.ReadStepLosses(filepath.Join(resumed, metrics.StepLossFile)); err != nil || len(sl) != 13 {
		t.Errorf("%s: %d entries (%v), want 13: steps 1-6, then 6-12", metrics.StepLossFile, len(sl), err)
	}
	if got := polylines(t, filepath.Join(resumed, "loss.svg"))[metrics.LossRawID]; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("resumed run's raw line %v,\nwant %v", got, want)
	}
}
