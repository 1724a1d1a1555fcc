package trace

import (
	"fmt"
	"html"
	"image/color"
	"io"
	"math"
	"strings"

	"github.com/titan-go/titan/internal/plot"
)

// catColor is each category's colour in the SVG timeline.
var catColor = map[string]string{
	CatCompute: "#c7d7ee", CatPipeline: "#9ec3e6", CatGEMM: "#2b6cb0", CatAttention: "#805ad5", CatNorm: "#38a169",
	CatElementw: "#68d391", CatOptimizer: "#dd6b20", CatCheckpoint: "#718096", CatComm: "#d69e2e",
	CatWait: "#e53e3e", CatBubble: "#a0aec0",
}

// lane is one row of the timeline.
type lane struct {
	label string
	spans []Span
}

// lanes splits a rank's spans into rows: the step's phases
// (forward-backward, grad norm, optimizer, checkpoint), the pipeline
// actions (when pipelined), the kernels with the waits and bubbles among
// them, then one row per collective track.
func lanes(r RankTrace) []lane {
	phase := lane{label: "phases"}
	pipe := lane{label: "pipeline actions"}
	kern := lane{label: "kernels, waits"}
	byTrack := map[string]*lane{}
	var order []*lane
	for _, s := range r.Spans {
		switch {
		case s.Track != MainTrack:
			l := byTrack[s.Track]
			if l == nil {
				l = &lane{label: s.Track}
				byTrack[s.Track] = l
				order = append(order, l)
			}
			l.spans = append(l.spans, s)
		case s.Cat == CatStep:
		case s.Cat == CatCompute || s.Cat == CatOptimizer || s.Cat == CatCheckpoint:
			phase.spans = append(phase.spans, s)
		case s.Cat == CatPipeline:
			pipe.spans = append(pipe.spans, s)
		default:
			kern.spans = append(kern.spans, s)
		}
	}
	out := []lane{phase}
	if len(pipe.spans) > 0 {
		out = append(out, pipe)
	}
	out = append(out, kern)
	for _, l := range order {
		out = append(out, *l)
	}
	return out
}

// WriteSVG draws the ranks' spans on one time axis (rank 0's clock): a
// band per rank with the lanes of lanes, step boundaries dashed, a legend
// of the categories. It is the picture of the merged trace that needs no
// trace viewer.
func WriteSVG(w io.Writer, ranks []RankTrace, title string) error {
	const left, right, laneH, gap, top, width = 170.0, 20.0, 16.0, 14.0, 50.0, 1500.0
	t0 := origin(ranks)
	var t1 int64
	for _, r := range ranks {
		for _, s := range r.Spans {
			t1 = max(t1, s.Start+r.Offset+s.Dur)
		}
	}
	span := math.Max(float64(t1-t0), 1)
	x := func(t int64) float64 { return left + (width-left-right)*float64(t-t0)/span }
	var b strings.Builder
	y := top
	var body strings.Builder
	for _, r := range ranks {
		ls := lanes(r)
		bandTop := y
		fmt.Fprintf(&body, `<text x="6" y="%.1f" font-weight="bold">rank %d (%s)</text>`+"\n", y+12, r.Rank, html.EscapeString(r.Host))
		for _, l := range ls {
			fmt.Fprintf(&body, `<text x="22" y="%.1f" fill="#4a5568">%s</text>`+"\n", y+laneH+10, html.EscapeString(l.label))
			fmt.Fprintf(&body, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#f7fafc"/>`+"\n", left, y+laneH, width-left-right, laneH-2)
			for _, s := range l.spans {
				x0, x1 := x(s.Start+r.Offset), x(s.Start+r.Offset+s.Dur)
				wd := math.Max(x1-x0, 0.5)
				col := catColor[s.Cat]
				if col == "" {
					col = "#cbd5e0"
				}
				name := s.Name
				if s.Cat == CatPipeline {
					name = fmt.Sprintf("%s%d.%d", s.Name, s.Stage, s.Microbatch)
				}
				tip := fmt.Sprintf("%s [%s] %.3f ms", name, s.Cat, float64(s.Dur)/1e6)
				if s.Bytes > 0 {
					tip += fmt.Sprintf(", %d bytes", s.Bytes)
				}
				fmt.Fprintf(&body, `<rect x="%.2f" y="%.1f" width="%.2f" height="%.1f" fill="%s"><title>%s</title></rect>`+"\n",
					x0, y+laneH, wd, laneH-2, col, html.EscapeString(tip))
				if s.Cat == CatPipeline && wd > 24 {
					fmt.Fprintf(&body, `<text x="%.1f" y="%.1f" font-size="10" fill="#1a202c">%s</text>`+"\n", x0+2, y+laneH+11, html.EscapeString(name))
				}
			}
			y += laneH
		}
		for _, s := range r.Spans {
			if s.Cat == CatStep && s.Track == MainTrack {
				for _, t := range []int64{s.Start, s.Start + s.Dur} {
					fmt.Fprintf(&body, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#2d3748" stroke-dasharray="3,3"/>`+"\n", x(t+r.Offset), x(t+r.Offset), bandTop+laneH, y+laneH)
				}
			}
		}
		y += laneH + gap
	}
	// Time axis.
	axisY := y + 10
	step := niceStep(span / 1e6 / 10)
	fmt.Fprintf(&body, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#2d3748"/>`+"\n", left, width-right, axisY, axisY)
	for ms := 0.0; ms <= span/1e6; ms += step {
		xx := x(t0 + int64(ms*1e6))
		fmt.Fprintf(&body, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#2d3748"/><text x="%.1f" y="%.1f" text-anchor="middle">%g ms</text>`+"\n",
			xx, xx, axisY, axisY+5, xx, axisY+18, ms)
	}
	// Legend.
	ly := axisY + 40
	lx := left
	for _, c := range legendCats {
		label := legendLabel(c)
		fmt.Fprintf(&body, `<rect x="%.1f" y="%.1f" width="12" height="12" fill="%s"/><text x="%.1f" y="%.1f">%s</text>`+"\n", lx, ly, catColor[c], lx+16, ly+10, label)
		lx += 16 + 7.5*float64(len(label)) + 14
	}
	height := ly + 30
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="6" y="24" font-size="16" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	b.WriteString(body.String())
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceStep rounds x up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

// hexColor parses "#rrggbb".
func hexColor(s string) color.RGBA {
	var r, g, b uint8
	fmt.Sscanf(s, "#%02x%02x%02x", &r, &g, &b)
	return color.RGBA{r, g, b, 255}
}

// WritePNG draws the same timeline as WriteSVG as a PNG (package plot),
// for pages that show pictures but not SVG.
func WritePNG(w io.Writer, ranks []RankTrace, title string) error {
	t0 := origin(ranks)
	ms := func(t int64) float64 { return float64(t-t0) / 1e6 }
	tl := plot.Timeline{Title: title, Unit: "ms"}
	for _, r := range ranks {
		tl.Rows = append(tl.Rows, plot.TimelineRow{Label: fmt.Sprintf("rank %d (%s)", r.Rank, r.Host), Heading: true})
		for _, l := range lanes(r) {
			row := plot.TimelineRow{Label: l.label}
			for _, s := range l.spans {
				col := catColor[s.Cat]
				if col == "" {
					col = "#cbd5e0"
				}
				b := plot.Box{From: ms(s.Start + r.Offset), To: ms(s.Start + r.Offset + s.Dur), Color: hexColor(col)}
				if s.Cat == CatPipeline {
					b.Label = fmt.Sprintf("%s%d.%d", s.Name, s.Stage, s.Microbatch)
				}
				row.Boxes = append(row.Boxes, b)
			}
			tl.Rows = append(tl.Rows, row)
		}
		if r.Rank == 0 {
			for _, s := range r.Spans {
				if s.Cat == CatStep && s.Track == MainTrack {
					tl.Marks = append(tl.Marks, ms(s.Start+r.Offset), ms(s.Start+r.Offset+s.Dur))
				}
			}
		}
	}
	for _, c := range legendCats {
		tl.Legend = append(tl.Legend, plot.LegendEntry{Label: legendLabel(c), Color: hexColor(catColor[c])})
	}
	return tl.WritePNG(w)
}

var legendCats = []string{CatPipeline, CatCompute, CatGEMM, CatAttention, CatNorm, CatElementw, CatOptimizer, CatComm, CatWait, CatBubble, CatCheckpoint}

func legendLabel(c string) string {
	switch c {
	case CatWait:
		return "wait (exposed comm)"
	case CatBubble:
		return "bubble (p2p wait)"
	case CatComm:
		return "collective (own track)"
	}
	return c
}
