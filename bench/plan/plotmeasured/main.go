// Command plotmeasured draws one run of bench/plan/measure.sh as an
// error plot: each layout's predicted tokens/s and memory per process
// against the median of its measured rounds (titan plan's ±15 % band).
//
// Usage: go run ./bench/plan/plotmeasured [-results FILE] [-run ID] [-out FILE.png]
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/titan-go/titan/internal/atomicfile"
	"github.com/titan-go/titan/internal/plan"
)

// row is one line of results.jsonl (the fields this plot reads).
type row struct {
	Run          string  `json:"run"`
	Round        int     `json:"round"`
	Layout       string  `json:"layout"`
	MeasuredTPS  float64 `json:"measured_tps_per_proc"`
	MeasuredMem  float64 `json:"measured_mem_gib"`
	PredictedTPS float64 `json:"predicted_tps_per_proc"`
	PredictedMem float64 `json:"predicted_mem_gib"`
}

func main() {
	results := flag.String("results", "bench/plan/results.jsonl", "measure.sh's raw rows")
	run := flag.String("run", "", "the run to draw (default: the newest in the file)")
	out := flag.String("out", "bench/plan/this_machine.png", "the PNG to write")
	flag.Parse()
	if err := draw(*results, *run, *out); err != nil {
		fmt.Fprintln(os.Stderr, "plotmeasured:", err)
		os.Exit(1)
	}
}

func draw(results, run, out string) error {
	f, err := os.Open(results)
	if err != nil {
		return err
	}
	defer f.Close()
	var rows []row
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var r row
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("%s:%d: %w", results, n, err)
		}
		rows = append(rows, r)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", results, err)
	}
	if run == "" {
		for _, r := range rows {
			run = max(run, r.Run) // run IDs are UTC timestamps
		}
	}
	var order []string
	by := map[string][]row{}
	for _, r := range rows {
		if r.Run != run {
			continue
		}
		if _, ok := by[r.Layout]; !ok {
			order = append(order, r.Layout)
		}
		by[r.Layout] = append(by[r.Layout], r)
	}
	if len(order) == 0 {
		return fmt.Errorf("%s has no rows of run %q", results, run)
	}
	tps := plan.ErrorPanel{Title: "tokens/s per process: titan plan against titan train (" + run + ")", Unit: "tokens/s per process", Against: "measured"}
	mem := plan.ErrorPanel{Title: "memory per process: titan plan against titan train (" + run + ")", Unit: "MiB", Against: "measured"}
	for _, l := range order {
		rs := by[l]
		tps.Points = append(tps.Points, plan.ErrorPoint{Name: l, Reference: median(rs, func(r row) float64 { return r.MeasuredTPS }), Predicted: rs[len(rs)-1].PredictedTPS})
		mem.Points = append(mem.Points, plan.ErrorPoint{Name: l, Reference: 1024 * median(rs, func(r row) float64 { return r.MeasuredMem }), Predicted: 1024 * rs[len(rs)-1].PredictedMem})
	}
	panels := []plan.ErrorPanel{tps, mem}
	// The host's speed drifts between the calibration and the runs; each
	// layout's tokens/s as a share of the one-process job's (medians)
	// takes the drift out.
	// As measure.sh's "vs one" column: each measured ratio taken within a
	// round, the median error over the rounds.
	if one, ok := by["one"]; ok {
		vs := plan.ErrorPanel{Title: "tokens/s per process over the same round's one-process job's (host drift removed)", Unit: "share of the one-process tokens/s", Against: "measured"}
		oneOf := map[int]row{}
		for _, r := range one {
			oneOf[r.Round] = r
		}
		for _, l := range order {
			if l == "one" {
				continue
			}
			var rel []float64 // predicted over measured ratio, round by round
			for _, r := range by[l] {
				if o, ok := oneOf[r.Round]; ok {
					rel = append(rel, (r.PredictedTPS/o.PredictedTPS)/(r.MeasuredTPS/o.MeasuredTPS))
				}
			}
			if len(rel) == 0 {
				continue
			}
			p := by[l][len(by[l])-1].PredictedTPS / one[len(one)-1].PredictedTPS
			vs.Points = append(vs.Points, plan.ErrorPoint{Name: l, Reference: p / medianOf(rel), Predicted: p})
		}
		panels = []plan.ErrorPanel{tps, vs, mem}
	}
	if err := atomicfile.Write(out, func(w io.Writer) error { return plan.WriteErrorPlot(w, panels) }); err != nil {
		return err
	}
	fmt.Printf("wrote %s (run %s, %d layouts)\n", out, run, len(order))
	return nil
}

// median is the median of f over rs (the mean of the middle two of an
// even count), as measure.sh's table reports.
func median(rs []row, f func(row) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	return medianOf(v)
}

// medianOf is the median of v (sorted in place).
func medianOf(v []float64) float64 {
	sort.Float64s(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
