package plot

import (
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"math"
	"strconv"
)

// Bars is a bar chart: one bar per label, on a linear axis from zero.
type Bars struct {
	Title, YLabel string
	Labels        []string
	Values        []float64
	// Width and Height of the image in pixels (0: 1000 × 640).
	Width, Height int
}

// WritePNG renders the chart and encodes it to w.
func (b Bars) WritePNG(w io.Writer) error {
	img, err := b.Render()
	if err != nil {
		return err
	}
	return png.Encode(w, img)
}

// Render draws the chart.
func (b Bars) Render() (*image.RGBA, error) {
	W, H := b.Width, b.Height
	if W == 0 {
		W = 1000
	}
	if H == 0 {
		H = 640
	}
	if len(b.Values) == 0 || len(b.Values) != len(b.Labels) {
		return nil, fmt.Errorf("plot: %d bars with %d labels", len(b.Values), len(b.Labels))
	}
	top := 0.0
	for i, v := range b.Values {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("plot: bar %q has value %g", b.Labels[i], v)
		}
		top = math.Max(top, v)
	}
	if top == 0 {
		return nil, errors.New("plot: every bar is zero")
	}
	// A round axis top: 1, 2 or 5 times a power of ten.
	step := math.Pow(10, math.Floor(math.Log10(top/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		if top/(m*step) <= 6 {
			step *= m
			break
		}
	}
	axis := math.Ceil(top/step) * step

	img := image.NewRGBA(image.Rect(0, 0, W, H))
	c := canvas{img}
	c.rect(0, 0, W, H, white)
	const scale = 2
	left, right, top0, bottom := 130, 40, 60, 90
	x0, x1, y0, y1 := left, W-right, top0, H-bottom
	py := func(v float64) int { return y1 - int(math.Round(v/axis*float64(y1-y0))) }
	for v := 0.0; v <= axis+step/2; v += step {
		y := py(v)
		c.rect(x0, y, x1, y+1, grid)
		lbl := strconv.FormatFloat(v, 'g', 6, 64)
		c.text(x0-10-textWidth(lbl, scale), y-glyphH*scale/2, lbl, scale, black)
	}
	n := len(b.Values)
	slot := float64(x1-x0) / float64(n)
	for i, v := range b.Values {
		col := Palette[i%len(Palette)]
		bx0 := x0 + int(float64(i)*slot+slot*0.2)
		bx1 := x0 + int(float64(i+1)*slot-slot*0.2)
		c.rect(bx0, py(v), bx1, y1, col)
		val := strconv.FormatFloat(v, 'g', 4, 64)
		c.text((bx0+bx1-textWidth(val, scale))/2, py(v)-glyphH*scale-6, val, scale, black)
		lbl := b.Labels[i]
		for textWidth(lbl, scale) > int(slot) && len(lbl) > 4 {
			lbl = lbl[:len(lbl)-1]
		}
		c.text((bx0+bx1-textWidth(lbl, scale))/2, y1+14, lbl, scale, black)
	}
	c.rect(x0, y1, x1+1, y1+1, black)
	c.rect(x0, y0, x0+1, y1, black)
	c.text((W-textWidth(b.Title, scale))/2, 20, b.Title, scale, black)
	c.vtext(20, y0+(y1-y0+textWidth(b.YLabel, scale))/2, b.YLabel, scale, black)
	return img, nil
}
