package plan

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"

	"github.com/titan-go/titan/internal/plot"
)

// ReferenceTarget is the relative error predictions are held to, against
// torchtitan's published rows and against titan's own measurements.
const ReferenceTarget = 0.15

// ErrorPanel is one panel of an error plot: predictions against the
// figures they predict (published or measured), in one unit.
type ErrorPanel struct {
	// Title heads the panel; Unit names the figures ("GiB"); Against
	// names what the predictions are compared with ("published").
	Title, Unit, Against string
	Points               []ErrorPoint
}

// ErrorPoint is one row of an ErrorPanel.
type ErrorPoint struct {
	Name                 string
	Reference, Predicted float64
	// Calibration marks the row the calibration was made from.
	Calibration bool
}

// WriteErrorPlot draws the panels side by side, each row's prediction
// error (in % of its reference figure) against the reference figure,
// with the ±ReferenceTarget band, each marker numbered and the rows
// listed by number beside the panel, and writes the PNG to w.
func WriteErrorPlot(w io.Writer, panels []ErrorPanel) error {
	if len(panels) == 0 {
		return fmt.Errorf("plan: an error plot of no panels")
	}
	// Each panel lists its rows beside the plot: tall enough for them.
	const W = 1000
	H := 700
	for _, p := range panels {
		H = max(H, 260+34*len(p.Points))
	}
	out := image.NewRGBA(image.Rect(0, 0, len(panels)*W, H))
	for i, p := range panels {
		if len(p.Points) == 0 {
			return fmt.Errorf("plan: error plot %q has no rows", p.Title)
		}
		for _, q := range p.Points {
			if !(q.Reference > 0) || math.IsInf(q.Reference, 0) || math.IsNaN(q.Predicted) || math.IsInf(q.Predicted, 0) {
				return fmt.Errorf("plan: error plot %q: row %q has %s %g and predicted %g", p.Title, q.Name, p.Against, q.Reference, q.Predicted)
			}
		}
		img, err := errorChart(p, W, H).Render()
		if err != nil {
			return fmt.Errorf("plan: error plot %q: %w", p.Title, err)
		}
		draw.Draw(out, image.Rect(i*W, 0, (i+1)*W, H), img, image.Point{}, draw.Src)
	}
	return png.Encode(w, out)
}

// WriteReferencePlot is WriteErrorPlot of the published rows: tokens/s
// per GPU and memory per GPU.
func WriteReferencePlot(w io.Writer, rs []RowResult) error {
	tps := ErrorPanel{Title: "tokens/s per GPU: titan plan against torchtitan's H100 tables", Unit: "tokens/s per GPU", Against: "published"}
	mem := ErrorPanel{Title: "memory per GPU: titan plan against torchtitan's H100 tables", Unit: "GiB", Against: "published"}
	for _, r := range rs {
		cal := r.Row.Note == "calibration row"
		tps.Points = append(tps.Points, ErrorPoint{r.Row.Name, r.Row.TPS, r.Prediction.TokensPerDevice, cal})
		if r.Row.HasMemory() {
			mem.Points = append(mem.Points, ErrorPoint{r.Row.Name, r.Row.MemGiB, r.Prediction.MemoryBytes / (1 << 30), cal})
		}
	}
	return WriteErrorPlot(w, []ErrorPanel{tps, mem})
}

// errorChart is one panel of WriteErrorPlot.
func errorChart(p ErrorPanel, w, h int) plot.Chart {
	gray := color.RGBA{0x70, 0x70, 0x70, 0xff}
	band := 100 * ReferenceTarget
	cal := plot.Series{Label: "calibration row", Color: plot.Palette[2], Points: true}
	in := plot.Series{Label: fmt.Sprintf("within %.0f %%", band), Color: plot.Palette[1], Points: true}
	out := plot.Series{Label: fmt.Sprintf("outside %.0f %%", band), Color: plot.Palette[0], Points: true}
	lo, hi := math.Inf(1), math.Inf(-1)
	var notes []string
	for i, q := range p.Points {
		e := q.Predicted/q.Reference - 1
		lo, hi = math.Min(lo, q.Reference), math.Max(hi, q.Reference)
		s := &in
		switch {
		case q.Calibration:
			s = &cal
		case math.Abs(e) > ReferenceTarget:
			s = &out
		}
		// Each marker carries its row's number; the notes say which row
		// that is and its error.
		n := fmt.Sprint(i + 1)
		s.X, s.Y, s.Labels = append(s.X, q.Reference), append(s.Y, 100*e), append(s.Labels, n)
		notes = append(notes, fmt.Sprintf("%2s %s: %+.1f%%", n, q.Name, 100*e))
	}
	if lo == hi {
		lo, hi = lo/1.1, hi*1.1
	}
	line := func(label string, y float64) plot.Series {
		return plot.Series{Label: label, X: []float64{lo, hi}, Y: []float64{y, y}, Color: gray, Dashed: true}
	}
	series := []plot.Series{line(fmt.Sprintf("target: within +/-%.0f %%", band), band), line("", -band)}
	for _, s := range []plot.Series{cal, in, out} {
		if len(s.X) > 0 {
			series = append(series, s)
		}
	}
	return plot.Chart{Title: p.Title, XLabel: p.Against + " " + p.Unit, YLabel: fmt.Sprintf("predicted - %s, %% of %s", p.Against, p.Against),
		Series: series, Notes: notes, Width: w, Height: h, LinearY: true}
}
