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

// ReferenceTarget is the relative error the published rows are held to.
const ReferenceTarget = 0.15

// WriteReferencePlot draws rs as two scatter panels side by side —
// tokens/s per GPU and memory per GPU, each row's prediction error (in %
// of the published figure) against the published figure, with the ±15 %
// target band — with the rows outside the band named under the legend,
// and writes the PNG to w.
func WriteReferencePlot(w io.Writer, rs []RowResult) error {
	if len(rs) == 0 {
		return fmt.Errorf("plan: no published rows to plot")
	}
	tps := make([]refPoint, len(rs))
	mem := make([]refPoint, len(rs))
	for i, r := range rs {
		cal := r.Row.Note == "calibration row"
		tps[i] = refPoint{r.Row.Name, r.Row.TPS, r.Prediction.TokensPerDevice, r.TPSErr, cal}
		mem[i] = refPoint{r.Row.Name, r.Row.MemGiB, r.Prediction.MemoryBytes / (1 << 30), r.MemErr, cal}
	}
	const W, H = 1000, 700
	out := image.NewRGBA(image.Rect(0, 0, 2*W, H))
	for i, p := range []struct {
		title, unit string
		pts         []refPoint
	}{
		{"tokens/s per GPU: titan plan against torchtitan's H100 tables", "tokens/s per GPU", tps},
		{"memory per GPU: titan plan against torchtitan's H100 tables", "GiB", mem},
	} {
		img, err := refChart(p.title, p.unit, p.pts, W, H).Render()
		if err != nil {
			return fmt.Errorf("plan: plot %s: %w", p.unit, err)
		}
		draw.Draw(out, image.Rect(i*W, 0, (i+1)*W, H), img, image.Point{}, draw.Src)
	}
	return png.Encode(w, out)
}

// refPoint is one published row on one panel.
type refPoint struct {
	name                 string
	published, predicted float64
	err                  float64 // predicted/published - 1
	calibration          bool
}

// refChart is one panel of WriteReferencePlot.
func refChart(title, unit string, pts []refPoint, w, h int) plot.Chart {
	gray := color.RGBA{0x70, 0x70, 0x70, 0xff}
	lo, hi := math.Inf(1), math.Inf(-1)
	var cal, in, out plot.Series
	cal = plot.Series{Label: "calibration row", Color: plot.Palette[2], Points: true}
	in = plot.Series{Label: fmt.Sprintf("within %.0f %%", 100*ReferenceTarget), Color: plot.Palette[1], Points: true}
	out = plot.Series{Label: fmt.Sprintf("outside %.0f %%", 100*ReferenceTarget), Color: plot.Palette[0], Points: true}
	var notes []string
	for _, p := range pts {
		lo, hi = math.Min(lo, p.published), math.Max(hi, p.published)
		s := &in
		switch {
		case p.calibration:
			s = &cal
		case math.Abs(p.err) > ReferenceTarget:
			s = &out
			notes = append(notes, fmt.Sprintf("%s: %+.1f%%", p.name, 100*p.err))
		}
		s.X, s.Y = append(s.X, p.published), append(s.Y, 100*p.err)
	}
	band := 100 * ReferenceTarget
	line := func(label string, y float64) plot.Series {
		return plot.Series{Label: label, X: []float64{lo, hi}, Y: []float64{y, y}, Color: gray, Dashed: true}
	}
	series := []plot.Series{line(fmt.Sprintf("target: within +/-%.0f %%", band), band), line("", -band)}
	for _, s := range []plot.Series{cal, in, out} {
		if len(s.X) > 0 {
			series = append(series, s)
		}
	}
	if len(notes) == 0 {
		notes = []string{fmt.Sprintf("every row within %.0f %%", 100*ReferenceTarget)}
	} else {
		notes = append([]string{"outside the band:"}, notes...)
	}
	return plot.Chart{Title: title, XLabel: "published " + unit, YLabel: "predicted - published, % of published",
		Series: series, Notes: notes, Width: w, Height: h, LinearY: true}
}
