package runstore

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/titan-go/titan/internal/metrics"
	"github.com/titan-go/titan/internal/plot"
)

// Metrics are the per-step metric names a plot can draw (the JSON keys
// of metrics.Record that hold numbers).
func Metrics() []string {
	b, _ := json.Marshal(metrics.Record{ValLoss: new(float64)})
	var m map[string]any
	json.Unmarshal(b, &m)
	var names []string
	for k := range m {
		if k != "step" {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	return names
}

// metricOf returns the named metric of r (false when the step has none).
func metricOf(r metrics.Record, name string) (float64, bool) {
	b, _ := json.Marshal(r)
	var m map[string]any
	json.Unmarshal(b, &m)
	v, ok := m[name].(float64)
	return v, ok
}

// PlotOptions choose what Plot draws.
type PlotOptions struct {
	// Metric is a per-step metric name (see Metrics).
	Metric string
	// Smooth is the exponential moving average's weight of the past
	// (0: 0.9; the raw values are drawn too, dashed).
	Smooth float64
}

// Plot draws metric against step for the runs ids (prefixes are
// resolved), raw (dashed) and smoothed, overlaid, as a PNG on w.
func Plot(ctx context.Context, s *Store, ids []string, o PlotOptions, w io.Writer) error {
	if !contains(Metrics(), o.Metric) {
		return fmt.Errorf("--metric %q: want one of %s", o.Metric, strings.Join(Metrics(), ", "))
	}
	beta := o.Smooth
	if beta == 0 {
		beta = 0.9
	}
	if beta < 0 || beta >= 1 {
		return fmt.Errorf("--smooth %g: want a weight in [0, 1)", beta)
	}
	chart := plot.LogLog{Title: o.Metric + " against step", XLabel: "step", YLabel: o.Metric,
		Notes: []string{fmt.Sprintf("dashed: raw; solid: exponential moving average (weight %g)", beta)}}
	for i, id := range ids {
		full, err := s.Resolve(ctx, id)
		if err != nil {
			return err
		}
		recs, err := s.Steps(ctx, full)
		if err != nil {
			return err
		}
		label := full
		if run, err := s.Get(ctx, full); err == nil && run.Description != "" {
			label = run.Description + " " + full // the legend says what each run was
		}
		col := plot.Palette[i%len(plot.Palette)]
		raw := plot.Series{Label: label + " raw", Color: col, Dashed: true}
		ema := plot.Series{Label: label, Color: col}
		for _, r := range recs {
			v, ok := metricOf(r, o.Metric)
			if !ok || !(v > 0) || math.IsInf(v, 0) {
				continue // log axes: only positive, finite values
			}
			raw.X, raw.Y = append(raw.X, float64(r.Step)), append(raw.Y, v)
		}
		ema.X, ema.Y = raw.X, plot.EMA(raw.Y, beta)
		if len(raw.Y) == 0 {
			return fmt.Errorf("run %s has no positive %s values to plot", full, o.Metric)
		}
		chart.Series = append(chart.Series, raw, ema)
	}
	return chart.WritePNG(w)
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
