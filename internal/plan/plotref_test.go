package plan

import (
	"bytes"
	"image"
	"image/png"
	"math"
	"testing"

	"github.com/titan-go/titan/internal/plot"
)

// TestReferencePlot: the published rows' plot is a PNG of two panels;
// each panel shows the calibration row in blue, a green marker for each
// row within the target and a red one for each row outside it — the
// counts taken from CompareReference, so the plot tells what the table
// tells.
func TestReferencePlot(t *testing.T) {
	rs, _, err := CompareReference(AssumedPriors)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteReferencePlot(&buf, rs); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	b := img.Bounds()
	H := b.Dy()
	if b.Dx() != 2000 || H < 700 {
		t.Fatalf("plot is %v, want two panels 1000 wide and at least 700 high", b)
	}
	rgba, ok := img.(*image.RGBA)
	if !ok {
		rgba = image.NewRGBA(b)
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				rgba.Set(x, y, img.At(x, y))
			}
		}
	}
	const marker = 9 * 9 // a marker's fill (legend markers: one per series)
	count := func(panel, palette int) int {
		c, n := plot.Palette[palette], 0
		for y := 0; y < H; y++ {
			for x := panel * 1000; x < (panel+1)*1000; x++ {
				if p := rgba.RGBAAt(x, y); p.R == c.R && p.G == c.G && p.B == c.B {
					n++
				}
			}
		}
		return n
	}
	for panel, errOf := range []func(RowResult) float64{
		func(r RowResult) float64 { return r.TPSErr },
		func(r RowResult) float64 { return r.MemErr },
	} {
		var in, out int
		for _, r := range rs {
			switch {
			case panel == 1 && !r.Row.HasMemory():
			case r.Row.Note == "calibration row":
			case math.Abs(errOf(r)) > ReferenceTarget:
				out++
			default:
				in++
			}
		}
		// Markers may overlap (rows with nearly equal figures, drawn
		// over by later series), so a series covers at most (rows + its
		// legend marker) × marker pixels, and more than its legend
		// marker's if it has any row.
		for _, c := range []struct {
			name    string
			palette int
			rows    int
		}{{"calibration", 2, 1}, {"within", 1, in}, {"outside", 0, out}} {
			got := count(panel, c.palette)
			switch {
			case c.rows == 0 && got != 0:
				t.Errorf("panel %d: %d pixels of the %q color with no such row", panel, got, c.name)
			case c.rows > 0 && (got <= marker || got > (c.rows+1)*marker):
				t.Errorf("panel %d: %d pixels of the %q color for %d rows (want %d to %d)", panel, got, c.name, c.rows, marker+1, (c.rows+1)*marker)
			}
		}
	}
}
