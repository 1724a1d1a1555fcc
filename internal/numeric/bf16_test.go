package numeric

import (
	"encoding/binary"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/titan-go/titan/internal/testenv"
)

// refBF16 is the reference float32 → bfloat16 conversion, written apart
// from Float32ToBF16: |x| is rounded to 8 significant bits by math/big
// (ties to even), or to a multiple of 2^-133 in the subnormal range, and
// values whose rounded magnitude reaches 2^128 become infinities. NaNs
// are handled by the callers.
func refBF16(x float32) uint16 {
	f := float64(x)
	neg := math.Signbit(f)
	a := math.Abs(f)
	var r float64
	switch {
	case math.IsInf(a, 0):
		r = a
	case a < 0x1p-126:
		r = math.RoundToEven(a*0x1p133) * 0x1p-133
	default:
		r, _ = new(big.Float).SetPrec(8).SetMode(big.ToNearestEven).SetFloat64(a).Float64()
		if r >= 0x1p128 {
			r = math.Inf(1)
		}
	}
	if neg {
		r = -r
	}
	// r is a bfloat16 value: its float32 has 16 zero low bits.
	u := math.Float32bits(float32(r))
	if u&0xffff != 0 {
		panic("refBF16: not a bfloat16 value")
	}
	return uint16(u >> 16)
}

// bf16Inputs returns float32 bit patterns covering every class of the
// bfloat16 conversion for every sign and exponent: for each of the 2^16
// upper halves, the lower halves that decide the rounding (zero, the
// smallest, just below, at and just above the tie, the largest) and two
// random ones. That covers zeros, subnormals, normals around each
// rounding boundary, ties, the largest values, overflow, infinities and
// NaNs with many payloads.
func bf16Inputs() []uint32 {
	rng := rand.New(rand.NewPCG(12, 1))
	lows := []uint32{0, 1, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0xffff}
	out := make([]uint32, 0, 1<<16*(len(lows)+2))
	for hi := uint32(0); hi < 1<<16; hi++ {
		for _, lo := range lows {
			out = append(out, hi<<16|lo)
		}
		out = append(out, hi<<16|rng.Uint32N(1<<16), hi<<16|rng.Uint32N(1<<16))
	}
	return out
}

func isNaN32(u uint32) bool { return u&0x7fffffff > 0x7f800000 }

// checkNaN16 reports whether h is the quiet NaN bfloat16 of the float32
// NaN u: same sign, quiet bit set, the leading payload bits kept.
func checkNaN16(u uint32, h uint16) bool {
	return h&0x7fff > 0x7f80 && h == uint16(u>>16)|0x0040
}

func TestFloat32ToBF16MatchesReference(t *testing.T) {
	for _, u := range bf16Inputs() {
		x := math.Float32frombits(u)
		got := Float32ToBF16(x)
		if isNaN32(u) {
			if !checkNaN16(u, got) {
				t.Fatalf("Float32ToBF16(NaN %#08x) = %#04x, want the quiet NaN %#04x", u, got, uint16(u>>16)|0x40)
			}
			continue
		}
		if want := refBF16(x); got != want {
			t.Fatalf("Float32ToBF16(%#08x = %g) = %#04x, want %#04x", u, x, got, want)
		}
		if u&0x7f800000 == 0 { // subnormal or zero: DAZ gives a signed zero
			if d := Float32ToBF16DAZ(x); d != uint16(u>>16)&0x8000 {
				t.Fatalf("Float32ToBF16DAZ(%#08x) = %#04x, want a signed zero", u, d)
			}
		} else if d := Float32ToBF16DAZ(x); d != got {
			t.Fatalf("Float32ToBF16DAZ(%#08x) = %#04x, Float32ToBF16 %#04x", u, d, got)
		}
	}
}

func TestBF16Specials(t *testing.T) {
	for _, c := range []struct {
		name string
		in   float32
		want uint16
	}{
		{"+0", 0, 0x0000},
		{"-0", float32(math.Copysign(0, -1)), 0x8000},
		{"1", 1, 0x3f80},
		{"tie to even down", math.Float32frombits(0x3f808000), 0x3f80},
		{"tie to even up", math.Float32frombits(0x3f818000), 0x3f82},
		{"above tie", math.Float32frombits(0x3f808001), 0x3f81},
		{"largest bf16", math.Float32frombits(0x7f7f0000), 0x7f7f},
		{"float32 max overflows", math.MaxFloat32, 0x7f80},
		{"just below overflow", math.Float32frombits(0x7f7f7fff), 0x7f7f},
		{"overflow tie", math.Float32frombits(0x7f7f8000), 0x7f80},
		{"+Inf", float32(math.Inf(1)), 0x7f80},
		{"-Inf", float32(math.Inf(-1)), 0xff80},
		{"smallest subnormal rounds to 0", math.Float32frombits(1), 0x0000},
		{"subnormal kept", math.Float32frombits(0x00010000), 0x0001},
		{"subnormal tie to even", math.Float32frombits(0x00018000), 0x0002},
		{"subnormal to smallest normal", math.Float32frombits(0x007fffff), 0x0080},
		{"quiet NaN", math.Float32frombits(0x7fc00000), 0x7fc0},
		{"negative NaN", math.Float32frombits(0xffc00001), 0xffc0},
		{"signalling NaN made quiet", math.Float32frombits(0x7f800001), 0x7fc0},
		{"NaN payload kept", math.Float32frombits(0x7fa50000), 0x7fe5},
	} {
		if got := Float32ToBF16(c.in); got != c.want {
			t.Errorf("%s: Float32ToBF16(%#08x) = %#04x, want %#04x", c.name, math.Float32bits(c.in), got, c.want)
		}
	}
}

func TestBF16ToFloat32Exact(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := BF16ToFloat32(uint16(h))
		u := math.Float32bits(f)
		if u != uint32(h)<<16 {
			t.Fatalf("BF16ToFloat32(%#04x) bits %#08x", h, u)
		}
		// Every bfloat16 survives the round trip (NaNs are quiet already
		// or become quiet).
		back := Float32ToBF16(f)
		if isNaN32(u) {
			if back != uint16(h)|0x40 {
				t.Fatalf("round trip of NaN %#04x gives %#04x", h, back)
			}
		} else if back != uint16(h) {
			t.Fatalf("round trip of %#04x gives %#04x", h, back)
		}
	}
}

// TestBF16Slices: the slice conversions (vectorized where the CPU
// allows) equal the scalar ones bit for bit on every class of
// bf16Inputs, NaNs included, and on every length and alignment of a
// short slice (the vector blocks and the scalar tail).
func TestBF16Slices(t *testing.T) {
	in := bf16Inputs()
	src := make([]float32, len(in))
	for i, u := range in {
		src[i] = math.Float32frombits(u)
	}
	check := func(src []float32) {
		t.Helper()
		h := make([]uint16, len(src))
		Float32sToBF16(h, src)
		back := make([]float32, len(h))
		BF16sToFloat32(back, h)
		for i, x := range src {
			if want := Float32ToBF16(x); h[i] != want {
				t.Fatalf("Float32sToBF16: element %d of %d (%#08x) = %#04x, want %#04x", i, len(src), math.Float32bits(x), h[i], want)
			}
			if math.Float32bits(back[i]) != uint32(h[i])<<16 {
				t.Fatalf("BF16sToFloat32: element %d of %d (%#04x) = %#08x", i, len(h), h[i], math.Float32bits(back[i]))
			}
			if !math.IsNaN(float64(x)) && math.Float32bits(RoundBF16(x)) != math.Float32bits(back[i]) {
				t.Fatalf("RoundBF16(%g) = %g, want %g", x, RoundBF16(x), back[i])
			}
		}
	}
	check(src)
	for off := 0; off < 3; off++ {
		for n := 0; n < 40; n++ {
			check(src[1000*n+off : 1000*n+off+n])
		}
	}
}

// TestBF16MatchesPyTorch: Float32ToBF16 equals PyTorch 1.13's
// tensor.to(torch.bfloat16) bit for bit on every class of bf16Inputs,
// except NaNs: PyTorch turns every NaN into 0xffff where titan keeps the
// sign and payload, so for NaNs both must only be NaN. And bfloat16 →
// float32 agrees on all 2^16 patterns.
func TestBF16MatchesPyTorch(t *testing.T) {
	py := testenv.Torch(t)
	dir := t.TempDir()
	in := bf16Inputs()
	buf := make([]byte, 4*len(in))
	for i, u := range in {
		binary.LittleEndian.PutUint32(buf[4*i:], u)
	}
	inPath, outPath, widePath := filepath.Join(dir, "in.f32"), filepath.Join(dir, "out.bf16"), filepath.Join(dir, "wide.f32")
	if err := os.WriteFile(inPath, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	script := `
import sys, numpy as np, torch
x = torch.from_numpy(np.fromfile(sys.argv[1], dtype=np.float32))
x.to(torch.bfloat16).view(torch.int16).numpy().tofile(sys.argv[2])
h = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
h.to(torch.float32).numpy().tofile(sys.argv[3])
`
	cmd := exec.Command(py, "-c", script, inPath, outPath, widePath)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	got, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2*len(in) {
		t.Fatalf("PyTorch wrote %d bytes, want %d", len(got), 2*len(in))
	}
	nans := 0
	for i, u := range in {
		want := binary.LittleEndian.Uint16(got[2*i:])
		mine := Float32ToBF16(math.Float32frombits(u))
		if isNaN32(u) {
			nans++
			if want&0x7fff <= 0x7f80 || mine&0x7fff <= 0x7f80 {
				t.Fatalf("NaN %#08x: PyTorch %#04x, titan %#04x: not both NaN", u, want, mine)
			}
			continue
		}
		if mine != want {
			t.Fatalf("%#08x (%g): titan %#04x, PyTorch %#04x", u, math.Float32frombits(u), mine, want)
		}
	}
	wide, err := os.ReadFile(widePath)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1<<16; i++ {
		h := uint16(i - 32768)
		want := binary.LittleEndian.Uint32(wide[4*i:])
		got := math.Float32bits(BF16ToFloat32(h))
		if got != want && !(isNaN32(got) && isNaN32(want)) {
			t.Fatalf("bf16 %#04x: titan %#08x, PyTorch %#08x", h, got, want)
		}
	}
	t.Logf("%d patterns agree with PyTorch (%d NaNs both NaN)", len(in), nans)
}

// BenchmarkFloat32sToBF16 times the slice conversion of one micro-batch
// worth of parameters (1 Mi elements).
func BenchmarkFloat32sToBF16(b *testing.B) {
	src := make([]float32, 1<<20)
	for i := range src {
		src[i] = float32(i) * 1e-3
	}
	dst := make([]uint16, len(src))
	for b.Loop() {
		Float32sToBF16(dst, src)
	}
	b.ReportMetric(float64(len(src)*b.N)/b.Elapsed().Seconds()/1e9, "Gelem/s")
}
