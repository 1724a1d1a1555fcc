package metrics

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/titan-go/titan/internal/plot"
)

// ReadJSONL reads the records of a metrics.jsonl file.
func ReadJSONL(path string) ([]Record, error) {
	var out []Record
	err := readLines(path, func(b []byte) error {
		var r Record
		err := json.Unmarshal(b, &r)
		out = append(out, r)
		return err
	})
	return out, err
}

// ReadStepLosses reads a StepLossFile.
func ReadStepLosses(path string) ([]StepLoss, error) {
	var out []StepLoss
	err := readLines(path, func(b []byte) error {
		var r StepLoss
		err := json.Unmarshal(b, &r)
		out = append(out, r)
		return err
	})
	return out, err
}

// readLines calls fn on each non-blank line of a JSON-lines file; an
// error names the file and the line.
func readLines(path string, fn func([]byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		if err := fn(sc.Bytes()); err != nil {
			return fmt.Errorf("metrics: %s:%d: %w", path, line, err)
		}
	}
	return sc.Err()
}

// LossSmoothing is the weight of the past in the exponential moving
// average loss.svg draws over the per-step loss (plot.EMA: the first
// step's loss, then 0.9·previous + 0.1·loss; titan plot's default too).
const LossSmoothing = 0.9

// SVG element ids of loss.svg's lines. Each polyline's points are in
// pixels; its data-points attribute holds the same points in data
// coordinates (step, loss), exactly (shortest round-trip digits). The
// axes' tick lines carry their value in data-value (class xtick, ytick).
const (
	LossRawID    = "loss-raw"
	LossSmoothID = "loss-smooth"
	LossValID    = "loss-val"
)

// PlotLoss writes an SVG chart of the training loss against the step:
// every step's loss (steps) as a thin line, its exponential moving
// average (LossSmoothing) on top, and the validation loss of records as
// a line with markers. A resumed run appends to both files; the latest
// entry of each step wins. With no steps (a dump of an older titan) the
// logged losses of records are drawn instead.
func PlotLoss(steps []StepLoss, records []Record, path, title string) error {
	raw := map[int]float64{}
	val := map[int]float64{}
	for _, r := range records {
		if len(steps) == 0 {
			raw[r.Step] = r.Loss
		}
		if r.ValLoss != nil {
			val[r.Step] = *r.ValLoss
		} else {
			delete(val, r.Step) // a later run of the step without validation
		}
	}
	for _, s := range steps {
		raw[s.Step] = s.Loss
	}
	if len(raw) == 0 && len(val) == 0 {
		return errors.New("metrics: no losses to plot")
	}
	rawS, rawY := sorted(raw)
	valS, valY := sorted(val)
	smooth := plot.EMA(rawY, LossSmoothing)

	maxStep := 1
	if len(rawS) > 0 {
		maxStep = max(maxStep, rawS[len(rawS)-1])
	}
	if len(valS) > 0 {
		maxStep = max(maxStep, valS[len(valS)-1])
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range append(append([]float64{}, rawY...), valY...) {
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	if hi == lo {
		lo, hi = lo-0.5, hi+0.5
	}
	ystep := niceStep((hi - lo) / 5)
	lo, hi = math.Floor(lo/ystep)*ystep, math.Ceil(hi/ystep)*ystep

	const W, H, left, right, top, bottom = 720.0, 420.0, 64.0, 24.0, 64.0, 48.0
	pw, ph := W-left-right, H-top-bottom
	sx, sy := pw/float64(maxStep), -ph/(hi-lo)
	tx, ty := left, top+ph*hi/(hi-lo)
	px := func(s float64) float64 { return tx + sx*s }
	py := func(v float64) float64 { return ty + sy*v }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%g" y="22" font-size="14">%s</text>`+"\n", left, escape(title))
	fmt.Fprintf(&b, `<text x="%g" y="40" fill="#555">thin: every step's loss; thick: its exponential moving average (weight %g of the past)</text>`+"\n", left, LossSmoothing)
	for v := lo; v <= hi+ystep/2; v += ystep {
		fmt.Fprintf(&b, `<line class="ytick" data-value="%s" x1="%g" x2="%g" y1="%.3f" y2="%.3f" stroke="#e2e2e2"/><text x="%g" y="%.2f" text-anchor="end">%s</text>`+"\n",
			g(v), left, W-right, py(v), py(v), left-6, py(v)+4, strconv.FormatFloat(v, 'f', decimals(ystep), 64))
	}
	xstep := max(1, int(niceStep(float64(maxStep)/6)))
	for s := 0; s <= maxStep; s += xstep {
		fmt.Fprintf(&b, `<line class="xtick" data-value="%d" x1="%.3f" x2="%.3f" y1="%g" y2="%g" stroke="#888"/><text x="%.2f" y="%g" text-anchor="middle">%d</text>`+"\n",
			s, px(float64(s)), px(float64(s)), top+ph, top+ph+4, px(float64(s)), top+ph+18, s)
	}
	fmt.Fprintf(&b, `<path d="M%g %g V%g H%g" fill="none" stroke="#444"/>`+"\n", left, top, top+ph, W-right)
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">step</text>`+"\n", left+pw/2, H-10)
	fmt.Fprintf(&b, `<text transform="translate(16 %g) rotate(-90)" text-anchor="middle">loss</text>`+"\n", top+ph/2)

	b.WriteString(`<g fill="none" stroke-linejoin="round">` + "\n")
	line := func(id, color string, width float64, s []int, y []float64) {
		if len(s) == 0 {
			return
		}
		pix, data := make([]string, len(s)), make([]string, len(s))
		for i := range s {
			pix[i] = fmt.Sprintf("%.3f,%.3f", px(float64(s[i])), py(y[i]))
			data[i] = strconv.Itoa(s[i]) + "," + g(y[i])
		}
		fmt.Fprintf(&b, `<polyline id="%s" stroke="%s" stroke-width="%g" points="%s" data-points="%s"/>`+"\n",
			id, color, width, strings.Join(pix, " "), strings.Join(data, " "))
	}
	line(LossRawID, "#9ecae1", 1, rawS, rawY)
	line(LossSmoothID, "#08519c", 2.25, rawS, smooth)
	line(LossValID, "#d62728", 1.75, valS, valY)
	b.WriteString("</g>\n")
	for i, s := range valS {
		fmt.Fprintf(&b, `<circle cx="%.2f" cy="%.2f" r="3.5" fill="#d62728"><title>step %d: validation loss %s</title></circle>`+"\n",
			px(float64(s)), py(valY[i]), s, g(valY[i]))
	}

	type entry struct {
		label, color string
		width        float64
		marker       bool
	}
	legend := []entry{{"loss (every step)", "#9ecae1", 1, false}, {"loss (smoothed)", "#08519c", 2.25, false}}
	if len(valS) > 0 {
		legend = append(legend, entry{"validation loss", "#d62728", 1.75, true})
	}
	lx, ly := W-right-170, top+12
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="164" height="%d" fill="white" fill-opacity="0.85" stroke="#ccc"/>`+"\n", lx-6, ly-12, 18*len(legend)+6)
	for i, e := range legend {
		y := ly + 18*float64(i)
		fmt.Fprintf(&b, `<line x1="%g" x2="%g" y1="%g" y2="%g" stroke="%s" stroke-width="%g"/>`, lx, lx+24, y-4, y-4, e.color, e.width)
		if e.marker {
			fmt.Fprintf(&b, `<circle cx="%g" cy="%g" r="3.5" fill="%s"/>`, lx+12, y-4, e.color)
		}
		fmt.Fprintf(&b, `<text x="%g" y="%g">%s</text>`+"\n", lx+30, y, e.label)
	}
	b.WriteString("</svg>\n")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return os.Rename(tmp, path)
}

// sorted returns m's steps in order and their values.
func sorted(m map[int]float64) ([]int, []float64) {
	s := make([]int, 0, len(m))
	for k := range m {
		s = append(s, k)
	}
	sort.Ints(s)
	y := make([]float64, len(s))
	for i, k := range s {
		y[i] = m[k]
	}
	return s, y
}

// g formats v with the fewest digits that read back as v.
func g(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// niceStep rounds x > 0 up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	if !(x > 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// decimals is how many decimals label a tick step.
func decimals(step float64) int {
	return max(0, int(math.Ceil(-math.Log10(step)-1e-9)))
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// PlotRun writes <dumpFolder>/loss.svg from <dumpFolder>/StepLossFile and
// <dumpFolder>/metrics.jsonl (PlotLoss).
func PlotRun(dumpFolder, title string) (string, error) {
	recs, err := ReadJSONL(filepath.Join(dumpFolder, RankFile(0)))
	if err != nil {
		return "", err
	}
	steps, err := ReadStepLosses(filepath.Join(dumpFolder, StepLossFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	out := filepath.Join(dumpFolder, "loss.svg")
	return out, PlotLoss(steps, recs, out, title)
}
