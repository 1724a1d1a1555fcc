package runstore

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"unicode/utf8"

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
	// RelativeTo, when set, names a baseline run: every run is drawn as
	// its relative difference to the baseline at the same step, in
	// percent (100·(v/base − 1)), on a linear axis; steps the baseline
	// lacks are left out.
	RelativeTo string
}

// Plot draws metric against step for the runs ids (prefixes are
// resolved), raw (dashed) and smoothed, overlaid, as a PNG on w; with
// o.RelativeTo, relative to that run.
func Plot(ctx context.Context, s *Store, ids []string, o PlotOptions, w io.Writer) error {
	chart, err := plotChart(ctx, s, ids, o)
	if err != nil {
		return err
	}
	return chart.WritePNG(w)
}

// plotChart builds Plot's chart: per run a raw series (dashed, not in
// the legend) and its moving average.
func plotChart(ctx context.Context, s *Store, ids []string, o PlotOptions) (plot.Chart, error) {
	if !contains(Metrics(), o.Metric) {
		return plot.Chart{}, fmt.Errorf("--metric %q: want one of %s", o.Metric, strings.Join(Metrics(), ", "))
	}
	beta := o.Smooth
	if beta == 0 {
		beta = 0.9
	}
	if beta < 0 || beta >= 1 {
		return plot.Chart{}, fmt.Errorf("--smooth %g: want a weight in [0, 1)", beta)
	}
	chart := plot.Chart{Title: o.Metric + " against step", XLabel: "step", YLabel: o.Metric, LinearX: true,
		Notes: []string{fmt.Sprintf("dashed: raw; solid: exponential moving average (weight %g)", beta)}}
	var base map[int]float64
	if o.RelativeTo != "" {
		full, err := s.Resolve(ctx, o.RelativeTo)
		if err != nil {
			return plot.Chart{}, fmt.Errorf("--relative-to: %w", err)
		}
		recs, err := s.Steps(ctx, full)
		if err != nil {
			return plot.Chart{}, err
		}
		base = map[int]float64{}
		for _, r := range recs {
			if v, ok := metricOf(r, o.Metric); ok && v != 0 && !math.IsNaN(v) && !math.IsInf(v, 0) {
				base[r.Step] = v
			}
		}
		// The run's description where the title has room for it (the
		// chart does not wrap its title).
		chart.Title = o.Metric + " relative to " + full
		if t := o.Metric + " relative to " + s.label(ctx, full); utf8.RuneCountInString(t) <= 60 {
			chart.Title = t
		}
		chart.YLabel = o.Metric + " difference (%)"
		chart.LinearY = true
	}
	for i, id := range ids {
		full, err := s.Resolve(ctx, id)
		if err != nil {
			return plot.Chart{}, err
		}
		recs, err := s.Steps(ctx, full)
		if err != nil {
			return plot.Chart{}, err
		}
		k := i
		if base != nil {
			k++ // the baseline keeps the first color, as in its plain plot
		}
		col := plot.Palette[k%len(plot.Palette)]
		raw := plot.Series{Color: col, Dashed: true}
		ema := plot.Series{Label: s.label(ctx, full), Color: col}
		for _, r := range recs {
			v, ok := metricOf(r, o.Metric)
			if !ok || math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			if base != nil {
				b, ok := base[r.Step]
				if !ok {
					continue
				}
				v = 100 * (v/b - 1)
			} else if !(v > 0) {
				continue // log axis: only positive values
			}
			raw.X, raw.Y = append(raw.X, float64(r.Step)), append(raw.Y, v)
		}
		if len(raw.Y) == 0 {
			if base != nil {
				return plot.Chart{}, fmt.Errorf("run %s has no %s values at the steps of the baseline %s", full, o.Metric, o.RelativeTo)
			}
			return plot.Chart{}, fmt.Errorf("run %s has no positive %s values to plot", full, o.Metric)
		}
		ema.X, ema.Y = raw.X, plot.EMA(raw.Y, beta)
		chart.Series = append(chart.Series, raw, ema)
	}
	return chart, nil
}

// label names run id in a legend: its description and id, or the id.
func (s *Store) label(ctx context.Context, id string) string {
	if run, err := s.Get(ctx, id); err == nil && run.Description != "" {
		return run.Description + " (" + id + ")"
	}
	return id
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
