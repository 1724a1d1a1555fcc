package float8

import (
	"math"
	"testing"

	"github.com/titan-go/titan/internal/numeric"
)

// TestRoundIsNumeric: Round is numeric's saturating conversion to the
// format and back, bit for bit, over every 97th float32 bit pattern and
// every pattern near the formats' boundaries (subnormals, the smallest
// normal, Max, Inf, NaN).
func TestRoundIsNumeric(t *testing.T) {
	ref := map[Format]func(float32) float32{
		E4M3: func(x float32) float32 { return numeric.E4M3ToFloat32(numeric.Float32ToE4M3Sat(x)) },
		E5M2: func(x float32) float32 { return numeric.E5M2ToFloat32(numeric.Float32ToE5M2Sat(x)) },
	}
	var special []uint32
	for _, v := range []float32{0x1p-6, 0x1p-9, 0x1p-10, 0x1p-14, 0x1p-16, 0x1p-17, 448, 464, 480, 57344, 61440, 65536, float32(math.Inf(1))} {
		b := math.Float32bits(v)
		for d := uint32(0); d < 1<<12; d++ {
			special = append(special, b-d, b+d)
		}
	}
	for f, want := range ref {
		check := func(b uint32) {
			for _, s := range []uint32{0, 0x80000000} {
				x := math.Float32frombits(b ^ s)
				got, w := f.Round(x), want(x)
				if math.Float32bits(got) != math.Float32bits(w) && !(got != got && w != w) {
					t.Fatalf("%v: Round(%g = %#08x) = %g, numeric gives %g", f, x, b^s, got, w)
				}
			}
		}
		for b := uint64(0); b < 1<<31; b += 97 {
			check(uint32(b))
		}
		for _, b := range special {
			check(b)
		}
	}
}

// TestScale: torchao's amax_to_scale, with the power-of-two rounding of
// the rowwise recipes and the floor on amax.
func TestScale(t *testing.T) {
	for _, tc := range []struct {
		amax float32
		f    Format
		pow2 bool
		want float32
	}{
		{2, E4M3, false, 224},
		{3, E4M3, false, 448.0 / 3},
		{3, E4M3, true, 128}, // 149.33 rounded down
		{2, E5M2, false, 28672},
		{0, E4M3, false, 448 / 1e-12},
		{1, E4M3, true, 256},
	} {
		if got := Scale(tc.amax, tc.f, tc.pow2); got != tc.want {
			t.Errorf("Scale(%g, %v, %v) = %g, want %g", tc.amax, tc.f, tc.pow2, got, tc.want)
		}
	}
}

// TestCastRowsCols: each row's (column's) amax element lands on the
// format's Max and the others are the rounded scaled values.
func TestCastRowsCols(t *testing.T) {
	x := []float32{1, -3, 0.5, 2, 0.25, -0.125}
	dst, s := make([]float32, 6), make([]float32, 2)
	RowAmax(s, x, 2, 3)
	if s[0] != 3 || s[1] != 2 {
		t.Fatalf("row amaxes %v", s)
	}
	Scales(s, s, E4M3, false)
	CastRows(dst, x, 2, 3, E4M3, s)
	if s[0] != 448.0/3 || s[1] != 224 {
		t.Fatalf("row scales %v", s)
	}
	if dst[1] != -448 || dst[3] != 448 || dst[4] != E4M3.Round(0.25*224) {
		t.Fatalf("rows cast to %v", dst)
	}
	sc := make([]float32, 3)
	ColAmax(sc, x, 2, 3)
	if sc[0] != 2 || sc[1] != 3 || sc[2] != 0.5 {
		t.Fatalf("column amaxes %v", sc)
	}
	Scales(sc, sc, E5M2, true)
	CastCols(dst, x, 2, 3, E5M2, sc)
	if sc[0] != Scale(2, E5M2, true) || sc[1] != Scale(3, E5M2, true) || sc[2] != Scale(0.5, E5M2, true) {
		t.Fatalf("column scales %v", sc)
	}
	if dst[5] != E5M2.Round(-0.125*sc[2]) {
		t.Fatalf("cols cast to %v", dst)
	}
}

// TestUnscale: dst = beta·dst + c/(rowScale·colScale), with scalar
// (one-element) and per-row/per-column scales.
func TestUnscale(t *testing.T) {
	c := []float32{8, 16, 32, 64}
	dst := []float32{1, 1, 9, 1, 1, 9}
	Unscale(dst, 3, c, 2, 2, []float32{2}, []float32{4, 8}, 1)
	want := []float32{2, 2, 9, 5, 5, 9}
	for i := range want {
		if dst[i] != want[i] {
			t.Fatalf("dst = %v, want %v", dst, want)
		}
	}
}

func TestParseRecipe(t *testing.T) {
	for i, n := range Recipes {
		if r, err := ParseRecipe(n); err != nil || r != Recipe(i) {
			t.Errorf("ParseRecipe(%q) = %v, %v", n, r, err)
		}
	}
	if _, err := ParseRecipe("delayed"); err == nil {
		t.Error("accepted delayed")
	}
	c := &Config{FilterFQNs: []string{"output", "layers.0."}}
	if c.Converts("output") || c.Converts("layers.0.attention.wq") || !c.Converts("layers.1.attention.wq") || !c.Converts("layers.10.attention.wq") {
		t.Error("filter_fqns")
	}
}

func BenchmarkCast(b *testing.B) {
	src := make([]float32, 1<<20)
	for i := range src {
		src[i] = float32(i%1000-500) * 0.37
	}
	dst := make([]float32, len(src))
	for _, f := range []Format{E4M3, E5M2} {
		b.Run(f.String(), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				Cast(dst, src, 0.5, f)
			}
			b.ReportMetric(float64(len(src)*b.N)/b.Elapsed().Seconds()/1e9, "Gelem/s")
		})
	}
}

// TestCastIsRound: the casts' fused loop is Round of the scaled values,
// bit for bit, NaN and the boundaries included.
func TestCastIsRound(t *testing.T) {
	var src []float32
	for b := uint64(0); b < 1<<32; b += 9973 {
		src = append(src, math.Float32frombits(uint32(b)))
	}
	src = append(src, float32(math.NaN()), float32(math.Inf(-1)), 0x1p-7, -464, 448)
	dst := make([]float32, len(src))
	for _, f := range []Format{E4M3, E5M2} {
		for _, s := range []float32{1, 0.75, 3} {
			Cast(dst, src, s, f)
			for i, v := range src {
				w := f.Round(v * s)
				if math.Float32bits(dst[i]) != math.Float32bits(w) && !(w != w && dst[i] != dst[i]) {
					t.Fatalf("%v: Cast(%g·%g) = %g, Round gives %g", f, v, s, dst[i], w)
				}
			}
		}
	}
}

// TestCastE4M3Bytes: the e4m3 bytes CastE4M3 writes widen (WidenE4M3)
// to the values Cast gives, bit for bit (NaN to a NaN), on every class of
// castInputs and several scales; WidenE4M3 is numeric's widening on all
// 256 patterns.
func TestCastE4M3Bytes(t *testing.T) {
	in := castInputs()
	codes, wide, want := make([]byte, len(in)), make([]float32, len(in)), make([]float32, len(in))
	for _, s := range []float32{1, 0.75, 3, 0x1p-100} {
		CastE4M3(codes, in, s)
		WidenE4M3(wide, codes)
		Cast(want, in, s, E4M3)
		for i := range in {
			if math.Float32bits(wide[i]) != math.Float32bits(want[i]) && !(wide[i] != wide[i] && want[i] != want[i]) {
				t.Fatalf("scale %v: %#08x cast to byte %#02x = %v, Cast gives %v", s, math.Float32bits(in[i]), codes[i], wide[i], want[i])
			}
		}
	}
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	WidenE4M3(wide[:256], all)
	for i, v := range wide[:256] {
		if w := numeric.E4M3ToFloat32(byte(i)); math.Float32bits(v) != math.Float32bits(w) {
			t.Fatalf("WidenE4M3(%#02x) = %v, numeric %v", i, v, w)
		}
	}
}
