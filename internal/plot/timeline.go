package plot

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
)

// Timeline is a Gantt-style chart: rows of coloured boxes on one time
// axis, a heading row per group of rows, and a legend.
type Timeline struct {
	Title string
	// Unit names the axis values ("ms").
	Unit   string
	Rows   []TimelineRow
	Legend []LegendEntry
	// Marks are vertical dashed lines (step boundaries) at axis values.
	Marks []float64
	// Width in pixels (0: 1600); the height follows the rows.
	Width int
}

// TimelineRow is one row; a Heading row has no boxes and prints bold.
type TimelineRow struct {
	Label   string
	Heading bool
	Boxes   []Box
}

// Box is an interval [From, To) of a row, in axis units.
type Box struct {
	From, To float64
	Color    color.RGBA
	// Label is printed inside the box when it fits.
	Label string
}

// LegendEntry names a colour.
type LegendEntry struct {
	Label string
	Color color.RGBA
}

// WritePNG renders the chart and encodes it to w.
func (t Timeline) WritePNG(w io.Writer) error {
	img, err := t.Render()
	if err != nil {
		return err
	}
	return png.Encode(w, img)
}

// Render draws the chart.
func (t Timeline) Render() (*image.RGBA, error) {
	if len(t.Rows) == 0 {
		return nil, errors.New("plot: a timeline without rows")
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range t.Rows {
		for _, b := range r.Boxes {
			if math.IsNaN(b.From) || math.IsNaN(b.To) || b.To < b.From {
				return nil, fmt.Errorf("plot: row %q has box [%g, %g)", r.Label, b.From, b.To)
			}
			lo, hi = math.Min(lo, b.From), math.Max(hi, b.To)
		}
	}
	if math.IsInf(lo, 0) || hi <= lo {
		return nil, errors.New("plot: a timeline without time")
	}
	lo = 0
	W := t.Width
	if W == 0 {
		W = 1600
	}
	const left, right, rowH, top = 200, 20, 18, 44
	H := top + rowH*len(t.Rows) + 90
	c := canvas{image.NewRGBA(image.Rect(0, 0, W, H))}
	c.rect(0, 0, W, H, color.RGBA{255, 255, 255, 255})
	ink := color.RGBA{26, 32, 44, 255}
	grey := color.RGBA{113, 128, 150, 255}
	c.text(8, 10, t.Title, 2, ink)
	x := func(v float64) int { return left + int(math.Round(float64(W-left-right)*(v-lo)/(hi-lo))) }
	for i, r := range t.Rows {
		y := top + i*rowH
		if r.Heading {
			c.text(6, y+4, r.Label, 2, ink)
			continue
		}
		c.text(22, y+5, r.Label, 1, grey)
		c.rect(left, y+2, W-right, y+rowH-2, color.RGBA{247, 250, 252, 255})
		for _, b := range r.Boxes {
			x0, x1 := x(b.From), x(b.To)
			if x1-x0 > 3 {
				x1-- // a gap between adjacent boxes
			}
			if x1 <= x0 {
				x1 = x0 + 1
			}
			c.rect(x0, y+2, x1, y+rowH-2, b.Color)
			if b.Label != "" && textWidth(b.Label, 1)+4 < x1-x0 {
				c.text(x0+2, y+5, b.Label, 1, ink)
			}
		}
	}
	bottom := top + rowH*len(t.Rows)
	for _, m := range t.Marks {
		phase := 0.0
		c.line(float64(x(m)), top, float64(x(m)), float64(bottom), 1, ink, 4, &phase)
	}
	// Axis.
	ay := bottom + 8
	phase := 0.0
	c.line(left, float64(ay), float64(W-right), float64(ay), 1, ink, 0, &phase)
	step := math.Pow(10, math.Floor(math.Log10((hi-lo)/8)))
	for _, m := range []float64{1, 2, 5, 10} {
		if (hi-lo)/(m*step) <= 10 {
			step *= m
			break
		}
	}
	for v := lo; v <= hi+step/1e6; v += step {
		xx := x(v)
		c.rect(xx, ay, xx+1, ay+5, ink)
		s := fmt.Sprintf("%g %s", math.Round(v*1e6)/1e6, t.Unit)
		c.text(xx-textWidth(s, 1)/2, ay+8, s, 1, ink)
	}
	// Legend.
	lx, ly := left, ay+30
	for _, e := range t.Legend {
		c.rect(lx, ly, lx+12, ly+12, e.Color)
		c.text(lx+16, ly+3, e.Label, 1, ink)
		lx += 16 + textWidth(e.Label, 1) + 18
		if lx > W-200 {
			lx, ly = left, ly+18
		}
	}
	return c.RGBA, nil
}
