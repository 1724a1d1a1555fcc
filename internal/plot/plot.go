// Package plot draws small line charts as PNG images with the standard
// library alone: logarithmic or linear axes, one polyline per series (solid or
// dashed), a legend, and labels in a built-in 5×7 bitmap font (capital
// letters, digits, common punctuation).
package plot

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"strconv"
	"strings"
)

// Series is one line of a chart.
type Series struct {
	// Label names the series in the legend (empty: drawn, not listed).
	Label string
	// X and Y are the points, the same number of each, all positive on
	// log axes.
	X, Y []float64
	// Color draws the line and its markers.
	Color color.RGBA
	// Dashed draws the line dashed.
	Dashed bool
	// Points draws the points as markers alone, without a line: a
	// scatter. Labels, where given, are written beside its markers, one
	// for each point.
	Points bool
	Labels []string
}

// Chart is a line chart with logarithmic axes, or linear ones where
// asked.
type Chart struct {
	Title, XLabel, YLabel string
	// Notes are extra lines printed under the legend.
	Notes  []string
	Series []Series
	// Width and Height of the image in pixels (0: 1000 × 640).
	Width, Height int
	// XBase2 labels a log x axis at powers of two ("2^10"), else at
	// powers of ten.
	XBase2 bool
	// LinearX and LinearY draw that axis on a linear scale (values may
	// then be zero or negative).
	LinearX, LinearY bool
}

// Palette holds distinct colors for series.
var Palette = []color.RGBA{
	{0xd6, 0x27, 0x28, 0xff}, // red
	{0x2c, 0xa0, 0x2c, 0xff}, // green
	{0x1f, 0x77, 0xb4, 0xff}, // blue
	{0xff, 0x7f, 0x0e, 0xff}, // orange
	{0x94, 0x67, 0xbd, 0xff}, // purple
	{0x8c, 0x56, 0x4b, 0xff}, // brown
}

var (
	white = color.RGBA{0xff, 0xff, 0xff, 0xff}
	black = color.RGBA{0x20, 0x20, 0x20, 0xff}
	grid  = color.RGBA{0xe2, 0xe2, 0xe2, 0xff}
	gray  = color.RGBA{0x70, 0x70, 0x70, 0xff}
)

// WritePNG renders the chart and encodes it to w.
func (p Chart) WritePNG(w io.Writer) error {
	img, err := p.Render()
	if err != nil {
		return err
	}
	return png.Encode(w, img)
}

// canvas is an image with drawing helpers.
type canvas struct{ *image.RGBA }

func (c canvas) set(x, y int, col color.RGBA) {
	if image.Pt(x, y).In(c.Rect) {
		c.SetRGBA(x, y, col)
	}
}

// rect fills [x0, x1) × [y0, y1).
func (c canvas) rect(x0, y0, x1, y1 int, col color.RGBA) {
	for y := y0; y < y1; y++ {
		for x := x0; x < x1; x++ {
			c.set(x, y, col)
		}
	}
}

// line draws a line of the given width from (x0, y0) to (x1, y1); with
// dash > 0 it is dashed, dash pixels on and dash/2 off, the pattern
// continuing from *phase (the length drawn so far).
func (c canvas) line(x0, y0, x1, y1 float64, width int, col color.RGBA, dash int, phase *float64) {
	dx, dy := x1-x0, y1-y0
	n := int(math.Ceil(math.Max(math.Abs(dx), math.Abs(dy))))
	if n == 0 {
		n = 1
	}
	step := math.Hypot(dx, dy) / float64(n)
	r := width / 2
	for i := 0; i <= n; i++ {
		if dash > 0 {
			on := math.Mod(*phase, float64(dash+dash/2)) < float64(dash)
			*phase += step
			if !on {
				continue
			}
		}
		x := int(math.Round(x0 + dx*float64(i)/float64(n)))
		y := int(math.Round(y0 + dy*float64(i)/float64(n)))
		c.rect(x-r, y-r, x-r+width, y-r+width, col)
	}
}

// text draws s with its top-left corner at (x, y).
func (c canvas) text(x, y int, s string, scale int, col color.RGBA) {
	for _, r := range s {
		g := glyphOf(r)
		for row := 0; row < glyphH; row++ {
			for k := 0; k < glyphW; k++ {
				if g[row][k] == '#' {
					c.rect(x+k*scale, y+row*scale, x+(k+1)*scale, y+(row+1)*scale, col)
				}
			}
		}
		x += glyphAdv * scale
	}
}

// vtext draws s rotated a quarter turn counter-clockwise, reading
// upwards, with its glyphs' left edge at x and the text ending at y.
func (c canvas) vtext(x, y int, s string, scale int, col color.RGBA) {
	for _, r := range s {
		g := glyphOf(r)
		for row := 0; row < glyphH; row++ {
			for k := 0; k < glyphW; k++ {
				if g[row][k] == '#' {
					// Glyph column k goes up, row goes right.
					c.rect(x+row*scale, y-(k+1)*scale, x+(row+1)*scale, y-k*scale, col)
				}
			}
		}
		y -= glyphAdv * scale
	}
}

// axis maps data values on one axis to [0, 1], on a log or a linear
// scale, and chooses its ticks.
type axis struct {
	lo, hi float64 // in the scale's units: log10 of the values, or the values
	log    bool
	base2  bool    // log axis labelled at powers of two
	step   float64 // a linear axis's tick step (0: from the span)
}

// newAxis spans [vmin, vmax]. A log axis reaches whole decades when tight
// is false; a linear one is padded by 5% and ends on ticks.
func newAxis(vmin, vmax float64, log, base2, tight bool) axis {
	a := axis{log: log, base2: base2}
	if log {
		a.lo, a.hi = math.Log10(vmin), math.Log10(vmax)
		if a.hi-a.lo < 1e-9 {
			a.lo, a.hi = a.lo-0.5, a.hi+0.5
		}
		if tight {
			pad := (a.hi - a.lo) * 0.03
			a.lo, a.hi = a.lo-pad, a.hi+pad
		} else {
			a.lo, a.hi = math.Floor(a.lo), math.Ceil(a.hi)
			if a.hi-a.lo < 1 {
				a.hi = a.lo + 1
			}
		}
		return a
	}
	a.lo, a.hi = vmin, vmax
	if a.hi-a.lo < 1e-12*math.Max(1, math.Abs(a.hi)) {
		a.lo, a.hi = a.lo-0.5, a.hi+0.5
	}
	pad := (a.hi - a.lo) * 0.05
	if tight {
		a.lo, a.hi = a.lo-pad, a.hi+pad
		return a
	}
	a.step = a.tickStep()
	a.lo, a.hi = math.Floor((a.lo-pad)/a.step)*a.step, math.Ceil((a.hi+pad)/a.step)*a.step
	return a
}

// frac places v on the axis: 0 at lo, 1 at hi.
func (a axis) frac(v float64) float64 {
	if a.log {
		v = math.Log10(v)
	}
	return (v - a.lo) / (a.hi - a.lo)
}

// tickStep is 1, 2 or 5 times a power of ten, giving 4 to 10 ticks.
func (a axis) tickStep() float64 {
	if a.step > 0 {
		return a.step
	}
	span := a.hi - a.lo
	step := math.Pow(10, math.Floor(math.Log10(span)))
	for span/step < 4 {
		switch {
		case span/(step/2) >= 4:
			step /= 2
		case span/(step/5) >= 4:
			step /= 5
		default:
			step /= 10
		}
	}
	for span/step > 10 {
		step *= 2
	}
	return step
}

// ticks are the labelled values; minor the unlabelled ones (2..9 × 10^k
// on a log axis whose decades are whole).
func (a axis) ticks() (major, minor []float64) {
	switch {
	case a.log && a.base2:
		k0, k1 := int(math.Ceil(a.lo/math.Log10(2))), int(math.Floor(a.hi/math.Log10(2)))
		every := max(1, (k1-k0+1)/10)
		for k := k0; k <= k1; k += every {
			major = append(major, math.Pow(2, float64(k)))
		}
	case a.log:
		for k := math.Ceil(a.lo - 1e-9); k <= a.hi+1e-9; k++ {
			major = append(major, math.Pow(10, k))
		}
		for k := math.Floor(a.lo); k < a.hi; k++ {
			for m := 2; m <= 9; m++ {
				if v := float64(m) * math.Pow(10, k); a.frac(v) >= 0 && a.frac(v) <= 1 {
					minor = append(minor, v)
				}
			}
		}
		if len(major) < 2 { // less than a decade shown: label the minor ticks
			major, minor = append(major, minor...), nil
		}
	default:
		step := a.tickStep()
		for k := math.Ceil(a.lo/step - 1e-9); k*step <= a.hi+step*1e-9; k++ {
			major = append(major, k*step)
		}
	}
	return major, minor
}

// label writes a tick value compactly.
func (a axis) label(v float64) string {
	if a.log {
		return tickLabel(v, a.base2)
	}
	if v == 0 || math.Abs(v) < a.tickStep()*1e-9 {
		return "0"
	}
	return strconv.FormatFloat(v, 'g', 6, 64)
}

// Render draws the chart.
func (p Chart) Render() (*image.RGBA, error) {
	W, H := p.Width, p.Height
	if W == 0 {
		W = 1000
	}
	if H == 0 {
		H = 640
	}
	if len(p.Series) == 0 {
		return nil, errors.New("plot: no series")
	}
	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, s := range p.Series {
		if len(s.X) != len(s.Y) {
			return nil, fmt.Errorf("plot: series %q has %d x and %d y values", s.Label, len(s.X), len(s.Y))
		}
		for i := range s.X {
			x, y := s.X[i], s.Y[i]
			switch {
			case math.IsNaN(x) || math.IsNaN(y) || math.IsInf(x, 0) || math.IsInf(y, 0):
				return nil, fmt.Errorf("plot: series %q: point (%g, %g) is not finite", s.Label, x, y)
			case (!p.LinearX && !(x > 0)) || (!p.LinearY && !(y > 0)):
				return nil, fmt.Errorf("plot: series %q: point (%g, %g) cannot go on log axes", s.Label, x, y)
			}
			xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
			ymin, ymax = math.Min(ymin, y), math.Max(ymax, y)
		}
	}
	if math.IsInf(xmin, 1) {
		return nil, errors.New("plot: no points")
	}
	// Axis ranges: x exactly the data's (a little wider), y out to whole
	// decades or ticks.
	ax := newAxis(xmin, xmax, !p.LinearX, p.XBase2, true)
	ay := newAxis(ymin, ymax, !p.LinearY, false, false)

	img := image.NewRGBA(image.Rect(0, 0, W, H))
	c := canvas{img}
	c.rect(0, 0, W, H, white)
	const scale = 2
	lineH := (glyphH + 4) * scale
	// The legend and the notes go right of the plot area, in at most 40%
	// of the width; longer labels and notes are wrapped.
	maxChars := (W*2/5 - 80) / (glyphAdv * scale)
	type entry struct {
		s     Series
		lines []string
	}
	var legend []entry
	right := 0
	for _, s := range p.Series {
		if s.Label == "" {
			continue // drawn, not listed
		}
		e := entry{s, wrap(s.Label, maxChars)}
		for _, l := range e.lines {
			right = max(right, 64+textWidth(l, scale))
		}
		legend = append(legend, e)
	}
	var notes []string
	for _, n := range p.Notes {
		notes = append(notes, wrap(n, maxChars+4)...)
	}
	for _, n := range notes {
		right = max(right, 16+textWidth(n, scale))
	}
	right = min(right+24, W*2/5+24)
	left, top, bottom := 110, 60, 80
	x0, x1, y0, y1 := left, W-right, top, H-bottom // plot area, y0 at the top
	px := func(v float64) float64 { return float64(x0) + ax.frac(v)*float64(x1-x0) }
	py := func(v float64) float64 { return float64(y1) - ay.frac(v)*float64(y1-y0) }

	// Grid and tick labels.
	xt, _ := ax.ticks()
	lastRight := math.MinInt
	for _, v := range xt {
		x := int(math.Round(px(v)))
		c.rect(x, y0, x+1, y1, grid)
		c.rect(x, y1, x+1, y1+6, black)
		lbl := ax.label(v)
		lw := textWidth(lbl, scale)
		if x-lw/2 < lastRight+8 {
			continue // it would overlap the previous label
		}
		c.text(x-lw/2, y1+12, lbl, scale, black)
		lastRight = x - lw/2 + lw
	}
	yt, ym := ay.ticks()
	for _, v := range yt {
		y := int(math.Round(py(v)))
		c.rect(x0, y, x1, y+1, grid)
		c.rect(x0-6, y, x0, y+1, black)
		lbl := ay.label(v)
		c.text(x0-10-textWidth(lbl, scale), y-glyphH*scale/2, lbl, scale, black)
	}
	for _, v := range ym {
		y := int(math.Round(py(v)))
		c.rect(x0-3, y, x0, y+1, black)
	}
	if p.LinearY && ay.lo < 0 && ay.hi > 0 { // the zero line
		y := int(math.Round(py(0)))
		c.rect(x0, y, x1, y+1, gray)
	}
	// Frame.
	c.rect(x0, y0, x1+1, y0+1, black)
	c.rect(x0, y1, x1+1, y1+1, black)
	c.rect(x0, y0, x0+1, y1, black)
	c.rect(x1, y0, x1+1, y1, black)

	// Series: markers only where the points are sparse enough to tell
	// apart.
	for _, s := range p.Series {
		dash := 0
		if s.Dashed {
			dash = 10
		}
		var phase float64
		if s.Points {
			for i := range s.X {
				x, y := int(math.Round(px(s.X[i]))), int(math.Round(py(s.Y[i])))
				marker(c, x, y, s.Color)
				if i < len(s.Labels) {
					c.text(x+10, y-glyphH*scale/2, s.Labels[i], scale, black)
				}
			}
			continue
		}
		for i := 1; i < len(s.X); i++ {
			c.line(px(s.X[i-1]), py(s.Y[i-1]), px(s.X[i]), py(s.Y[i]), 3, s.Color, dash, &phase)
		}
		if len(s.X) <= (x1-x0)/12 {
			for i := range s.X {
				x, y := int(math.Round(px(s.X[i]))), int(math.Round(py(s.Y[i])))
				c.rect(x-3, y-3, x+4, y+4, s.Color)
			}
		}
	}

	// Title, axis labels, legend, notes.
	c.text((W-textWidth(p.Title, scale))/2, 20, p.Title, scale, black)
	c.text(x0+(x1-x0-textWidth(p.XLabel, scale))/2, H-bottom+44, p.XLabel, scale, black)
	c.vtext(20, y0+(y1-y0+textWidth(p.YLabel, scale))/2, p.YLabel, scale, black)
	ly := y0 + 4
	for _, e := range legend {
		var phase float64
		dash := 0
		if e.s.Dashed {
			dash = 10
		}
		if e.s.Points {
			marker(c, x1+36, ly+glyphH*scale/2, e.s.Color)
		} else {
			c.line(float64(x1+16), float64(ly+glyphH*scale/2), float64(x1+56), float64(ly+glyphH*scale/2), 3, e.s.Color, dash, &phase)
		}
		for _, l := range e.lines {
			c.text(x1+64, ly, l, scale, black)
			ly += lineH
		}
		ly += 4
	}
	ly += lineH
	for _, n := range notes {
		c.text(x1+16, ly, n, scale, gray)
		ly += lineH
	}
	return img, nil
}

// marker draws a scatter point at (x, y): a filled square with a dark
// rim, so that overlapping points stay apart.
func marker(c canvas, x, y int, col color.RGBA) {
	c.rect(x-6, y-6, x+7, y+7, black)
	c.rect(x-4, y-4, x+5, y+5, col)
}

// wrap splits s into lines of at most n runes at spaces (a longer word
// gets a line of its own).
func wrap(s string, n int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		switch {
		case line == "":
			line = w
		case len([]rune(line))+1+len([]rune(w)) <= n:
			line += " " + w
		default:
			lines = append(lines, line)
			line = w
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// tickLabel writes v compactly: "2^k" on a base-2 axis, else plain
// decimals for 1e-3..1e4 and "1E-5"-style beyond.
func tickLabel(v float64, base2 bool) string {
	if base2 {
		return "2^" + strconv.Itoa(int(math.Round(math.Log2(v))))
	}
	k := int(math.Round(math.Log10(v)))
	if k >= -3 && k <= 4 {
		// Ticks are computed in floating point (3 × 0.1 is
		// 0.30000000000000004): six significant figures.
		return strconv.FormatFloat(v, 'g', 6, 64)
	}
	return "1E" + strconv.Itoa(k)
}
