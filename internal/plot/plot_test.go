package plot

import (
	"bytes"
	"image/color"
	"image/png"
	"math"
	"strings"
	"testing"
)

// TestLogLogPNG: a chart decodes as a PNG of the requested size, each
// series' color appears where its points are, and the labels are drawn.
func TestLogLogPNG(t *testing.T) {
	xs := []float64{1024, 2048, 4096, 8192}
	quad, lin := make([]float64, len(xs)), make([]float64, len(xs))
	for i, x := range xs {
		quad[i], lin[i] = x*x*1e-9, x*1e-6
	}
	p := Chart{
		Title: "time against length", XLabel: "length", YLabel: "seconds", XBase2: true,
		Notes:  []string{"lazy skipped above 2^12"},
		Series: []Series{{Label: "lazy", X: xs, Y: quad, Color: Palette[0]}, {Label: "flash", X: xs, Y: lin, Color: Palette[2], Dashed: true}},
		Width:  800, Height: 500,
	}
	var buf bytes.Buffer
	if err := p.WritePNG(&buf); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 800 || b.Dy() != 500 {
		t.Fatalf("image is %v", b)
	}
	count := func(c color.RGBA) int {
		n := 0
		b := img.Bounds()
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				r, g, bb, _ := img.At(x, y).RGBA()
				if uint8(r>>8) == c.R && uint8(g>>8) == c.G && uint8(bb>>8) == c.B {
					n++
				}
			}
		}
		return n
	}
	for _, c := range []color.RGBA{Palette[0], Palette[2], black} {
		if count(c) < 200 {
			t.Errorf("color %v drawn on %d pixels only", c, count(c))
		}
	}
}

func TestLogLogRefusesBadPoints(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Series
		want string
	}{
		{"zero", Series{Label: "a", X: []float64{1, 2}, Y: []float64{0, 1}}, "log axes"},
		{"NaN", Series{Label: "a", X: []float64{1, 2}, Y: []float64{math.NaN(), 1}}, "not finite"},
		{"ragged", Series{Label: "a", X: []float64{1, 2}, Y: []float64{1}}, "1 y values"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Chart{Series: []Series{tc.s}}.Render()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %q", err, tc.want)
			}
		})
	}
	if _, err := (Chart{}).Render(); err == nil {
		t.Error("a chart without series rendered")
	}
}

// TestLinearAxes: a linear y axis takes zero and negative values, ends on
// ticks of 1, 2 or 5 times a power of ten that include zero, and still
// refuses what is not finite; the x axis stays logarithmic unless asked.
func TestLinearAxes(t *testing.T) {
	s := Series{Label: "rel", X: []float64{1, 2, 3}, Y: []float64{-0.3, 0, 0.45}, Color: Palette[1]}
	if _, err := (Chart{Series: []Series{s}, LinearY: true}).Render(); err != nil {
		t.Fatalf("linear y: %v", err)
	}
	if _, err := (Chart{Series: []Series{s}}).Render(); err == nil || !strings.Contains(err.Error(), "log axes") {
		t.Fatalf("log y took a negative value: %v", err)
	}
	inf := Series{X: []float64{1}, Y: []float64{math.Inf(1)}}
	if _, err := (Chart{Series: []Series{inf}, LinearX: true, LinearY: true}).Render(); err == nil {
		t.Fatal("linear axes took +Inf")
	}
	for _, tc := range []struct {
		lo, hi   float64
		wantStep float64
	}{
		{-0.3, 0.45, 0.1},
		{0, 300, 50},
		{1.85, 8.1, 1},
		{1000, 1001, 0.2},
	} {
		a := newAxis(tc.lo, tc.hi, false, false, false)
		major, _ := a.ticks()
		step := a.tickStep()
		if math.Abs(step-tc.wantStep) > 1e-12*tc.wantStep {
			t.Errorf("[%g, %g]: tick step %g, want %g", tc.lo, tc.hi, step, tc.wantStep)
		}
		if len(major) < 4 || len(major) > 11 {
			t.Errorf("[%g, %g]: %d ticks %v", tc.lo, tc.hi, len(major), major)
		}
		if a.lo > tc.lo || a.hi < tc.hi {
			t.Errorf("[%g, %g]: axis [%g, %g] does not cover the data", tc.lo, tc.hi, a.lo, a.hi)
		}
		if tc.lo < 0 && tc.hi > 0 {
			zero := false
			for _, v := range major {
				zero = zero || math.Abs(v) < step*1e-9
			}
			if !zero {
				t.Errorf("[%g, %g]: no tick at zero in %v", tc.lo, tc.hi, major)
			}
		}
	}
}

func TestTickLabel(t *testing.T) {
	for _, tc := range []struct {
		v     float64
		base2 bool
		want  string
	}{
		{1024, true, "2^10"}, {131072, true, "2^17"}, {0.001, false, "0.001"}, {100, false, "100"}, {1e-5, false, "1E-5"}, {1e6, false, "1E6"},
	} {
		if got := tickLabel(tc.v, tc.base2); got != tc.want {
			t.Errorf("tickLabel(%g, %v) = %q, want %q", tc.v, tc.base2, got, tc.want)
		}
	}
}

func TestWrap(t *testing.T) {
	got := wrap("d_model 32, 2 layers, order 2, batch 1", 12)
	want := []string{"d_model 32,", "2 layers,", "order 2,", "batch 1"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("wrap = %q, want %q", got, want)
	}
	if got := wrap("", 5); len(got) != 0 {
		t.Errorf("wrap of nothing = %q", got)
	}
}

// TestBars: a bar chart renders, and bad values are refused.
func TestBars(t *testing.T) {
	var buf bytes.Buffer
	if err := (Bars{Title: "tokens/s", Labels: []string{"a", "b"}, Values: []float64{3520, 3054}}).WritePNG(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(&buf); err != nil {
		t.Fatal(err)
	}
	for _, b := range []Bars{
		{Labels: []string{"a"}, Values: []float64{math.NaN()}},
		{Labels: []string{"a"}, Values: []float64{-1}},
		{Labels: []string{"a", "b"}, Values: []float64{1}},
		{Labels: []string{"a"}, Values: []float64{0}},
	} {
		if _, err := b.Render(); err == nil {
			t.Errorf("%+v rendered", b)
		}
	}
}

// TestPoints: a Points series draws a marker at each point and no line
// between them: its color covers the two markers and the legend's (9×9
// pixels each), where the same series as a line covers hundreds more.
func TestPoints(t *testing.T) {
	greens := func(points bool) int {
		c := Chart{Title: "scatter", XLabel: "x", YLabel: "y", Width: 800, Height: 500,
			Series: []Series{{Label: "points", X: []float64{1, 100}, Y: []float64{1, 100}, Color: Palette[1], Points: points}}}
		img, err := c.Render()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for y := 0; y < 500; y++ {
			for x := 0; x < 800; x++ {
				if p := img.RGBAAt(x, y); p.R == Palette[1].R && p.G == Palette[1].G && p.B == Palette[1].B {
					n++
				}
			}
		}
		return n
	}
	pts, line := greens(true), greens(false)
	if pts != 3*9*9 {
		t.Errorf("points: %d pixels of the series' color, want the three markers' %d", pts, 3*9*9)
	}
	if line < pts+500 {
		t.Errorf("line: %d pixels of the series' color, want hundreds more than the markers' %d", line, pts)
	}
}
