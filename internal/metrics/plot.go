package metrics

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// ReadJSONL reads the records of a metrics.jsonl file.
func ReadJSONL(path string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer f.Close()
	var out []Record
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("metrics: %s:%d: %w", path, line, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// PlotLoss writes an SVG chart of the training loss (line) and the
// validation loss (dots) against the step. A resumed run appends to
// metrics.jsonl; the latest record of each step wins.
func PlotLoss(records []Record, path, title string) error {
	byStep := map[int]Record{}
	maxStep := 0
	for _, r := range records {
		byStep[r.Step] = r
		maxStep = max(maxStep, r.Step)
	}
	if len(byStep) == 0 {
		return fmt.Errorf("metrics: no records to plot")
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range byStep {
		lo, hi = math.Min(lo, r.Loss), math.Max(hi, r.Loss)
		if r.ValLoss != nil {
			lo, hi = math.Min(lo, *r.ValLoss), math.Max(hi, *r.ValLoss)
		}
	}
	if hi == lo {
		hi = lo + 1
	}
	lo = math.Floor(lo)
	hi = math.Ceil(hi)
	const W, H, left, right, top, bottom = 640.0, 400.0, 60.0, 20.0, 52.0, 50.0
	x := func(step int) float64 { return left + (W-left-right)*float64(step)/float64(max(maxStep, 1)) }
	y := func(v float64) float64 { return top + (H-top-bottom)*(hi-v)/(hi-lo) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%g" y="20" font-size="14">%s</text>`+"\n", left, escape(title))
	for i := 0; i <= 4; i++ {
		v := lo + (hi-lo)*float64(i)/4
		fmt.Fprintf(&b, `<line x1="%g" x2="%g" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%g" y="%.1f" text-anchor="end">%.2f</text>`+"\n", left, W-right, y(v), y(v), left-6, y(v)+4, v)
		s := maxStep * i / 4
		fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="middle">%d</text>`+"\n", x(s), H-bottom+18, s)
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">step</text>`+"\n", (W+left)/2, H-12)
	var pts, dots []string
	for s := 0; s <= maxStep; s++ {
		r, ok := byStep[s]
		if !ok {
			continue
		}
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s), y(r.Loss)))
		if r.ValLoss != nil {
			dots = append(dots, fmt.Sprintf(`<circle cx="%.1f" cy="%.1f" r="3.5" fill="#d62728"/>`, x(s), y(*r.ValLoss)))
		}
	}
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="%s"/>`+"\n", strings.Join(pts, " "))
	b.WriteString(strings.Join(dots, "\n") + "\n")
	fmt.Fprintf(&b, `<text x="%g" y="%g" fill="#1f77b4">training loss</text><text x="%g" y="%g" fill="#d62728">validation loss</text>`+"\n", W-right-220, top-12, W-right-110, top-12)
	b.WriteString("</svg>\n")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return os.Rename(tmp, path)
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// PlotRun writes <dumpFolder>/loss.svg from <dumpFolder>/metrics.jsonl.
func PlotRun(dumpFolder, title string) (string, error) {
	recs, err := ReadJSONL(filepath.Join(dumpFolder, "metrics.jsonl"))
	if err != nil {
		return "", err
	}
	out := filepath.Join(dumpFolder, "loss.svg")
	return out, PlotLoss(recs, out, title)
}
