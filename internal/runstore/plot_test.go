package runstore

import (
	"bytes"
	"image/png"
	"math"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/metrics"
)

// TestPlotRelativeTo: with a baseline, each run is drawn as its relative
// difference to the baseline at the same step in percent (steps the
// baseline lacks left out), the raw series unlisted and the moving
// average labelled with the run's description; without one, the raw
// values themselves.
func TestPlotRelativeTo(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, backends(t)[0].fresh(t))
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	put := func(id, desc string, loss map[int]float64) {
		r := testRun(id, start)
		r.Description = desc
		if err := s.PutRun(ctx, r); err != nil {
			t.Fatal(err)
		}
		var recs []metrics.Record
		for step := 1; step <= 4; step++ {
			if v, ok := loss[step]; ok {
				recs = append(recs, metrics.Record{Step: step, Loss: v})
			}
		}
		if err := s.PutSteps(ctx, id, recs); err != nil {
			t.Fatal(err)
		}
	}
	put("20261201-100000-base", "float32", map[int]float64{1: 4, 2: 2, 3: 1})
	put("20261201-100000-half", "bfloat16", map[int]float64{1: 4.4, 2: 1.9, 3: 1, 4: 0.5})

	c, err := plotChart(ctx, s, []string{"20261201-100000-half"}, PlotOptions{Metric: "loss", Smooth: 0.5, RelativeTo: "20261201-100000-base"})
	if err != nil {
		t.Fatal(err)
	}
	if !c.LinearX || !c.LinearY || len(c.Series) != 2 {
		t.Fatalf("chart: linear x %v, y %v, %d series", c.LinearX, c.LinearY, len(c.Series))
	}
	raw, ema := c.Series[0], c.Series[1]
	want := []float64{10, -5, 0} // step 4 has no baseline
	if len(raw.Y) != len(want) {
		t.Fatalf("raw %v, want %v", raw.Y, want)
	}
	for i := range want {
		if math.Abs(raw.Y[i]-want[i]) > 1e-9 || raw.X[i] != float64(i+1) {
			t.Errorf("point %d: (%g, %g), want (%d, %g)", i, raw.X[i], raw.Y[i], i+1, want[i])
		}
	}
	if raw.Label != "" || ema.Label != "bfloat16 (20261201-100000-half)" {
		t.Errorf("labels %q, %q", raw.Label, ema.Label)
	}
	if want := 0.5*10 + 0.5*-5; math.Abs(ema.Y[1]-want) > 1e-9 {
		t.Errorf("moving average at step 2: %g, want %g", ema.Y[1], want)
	}

	// Without a baseline: the values, on a log y axis.
	c, err = plotChart(ctx, s, []string{"20261201-100000-base", "20261201-100000-half"}, PlotOptions{Metric: "loss"})
	if err != nil {
		t.Fatal(err)
	}
	if c.LinearY || len(c.Series) != 4 || c.Series[2].Y[3] != 0.5 {
		t.Fatalf("plain chart: linear y %v, %d series", c.LinearY, len(c.Series))
	}
	var buf bytes.Buffer
	if err := Plot(ctx, s, []string{"20261201-100000-half"}, PlotOptions{Metric: "loss", RelativeTo: "20261201-100000-base"}, &buf); err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := plotChart(ctx, s, []string{"20261201-100000-half"}, PlotOptions{Metric: "loss", RelativeTo: "nosuchrun"}); err == nil {
		t.Error("an unknown baseline was accepted")
	}
}
