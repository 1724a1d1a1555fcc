package numeric

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// refFormat is an independent description of an 8-bit format for the
// reference: every code decoded with math.Ldexp.
type refFormat struct {
	name        string
	ebits, bias int
	hasInf      bool
	from        func(float32) uint8
	fromSat     func(float32) uint8
	to          func(uint8) float32
	max         float64
}

var refFormats = []refFormat{
	{name: "e4m3fn", ebits: 4, bias: 7, from: Float32ToE4M3, fromSat: Float32ToE4M3Sat, to: E4M3ToFloat32, max: MaxE4M3},
	{name: "e5m2", ebits: 5, bias: 15, hasInf: true, from: Float32ToE5M2, fromSat: Float32ToE5M2Sat, to: E5M2ToFloat32, max: MaxE5M2},
}

func (f refFormat) mbits() int { return 7 - f.ebits }

// decode returns the value of code c, and whether it is NaN or infinite.
func (f refFormat) decode(c uint8) (v float64, nan, inf bool) {
	m := f.mbits()
	e := int(c>>m) & (1<<f.ebits - 1)
	mant := int(c) & (1<<m - 1)
	sign := 1.0
	if c&0x80 != 0 {
		sign = -1
	}
	top := 1<<f.ebits - 1
	if f.hasInf && e == top {
		if mant == 0 {
			return math.Inf(int(sign)), false, true
		}
		return math.NaN(), true, false
	}
	if !f.hasInf && e == top && mant == 1<<m-1 {
		return math.NaN(), true, false
	}
	if e == 0 {
		return sign * math.Ldexp(float64(mant), 1-f.bias-m), false, false
	}
	return sign * math.Ldexp(float64(1<<m+mant), e-f.bias-m), false, false
}

// positives returns the finite non-negative codes sorted by value, and
// the value one spacing above the largest (the first value the format
// lacks), with whether its mantissa would be even.
func (f refFormat) positives() (codes []uint8, vals []float64, beyond float64, beyondEven bool) {
	for c := 0; c < 128; c++ {
		v, nan, inf := f.decode(uint8(c))
		if !nan && !inf {
			codes = append(codes, uint8(c))
			vals = append(vals, v)
		}
	}
	sort.Sort(byValue{codes, vals})
	n := len(vals)
	beyond = 2*vals[n-1] - vals[n-2]
	// The largest code's successor is the code one above it.
	beyondEven = (codes[n-1]+1)&1 == 0
	return codes, vals, beyond, beyondEven
}

type byValue struct {
	c []uint8
	v []float64
}

func (b byValue) Len() int           { return len(b.c) }
func (b byValue) Less(i, j int) bool { return b.v[i] < b.v[j] }
func (b byValue) Swap(i, j int) {
	b.c[i], b.c[j] = b.c[j], b.c[i]
	b.v[i], b.v[j] = b.v[j], b.v[i]
}

// reference converts x: the nearest code, ties to the even mantissa
// (even code), with the value beyond the largest standing for overflow;
// overflow and infinities go to the largest value when sat is set and to
// NaN (e4m3fn) or infinity (e5m2) otherwise. NaN gives sign|0x7f.
func (f refFormat) reference(x float32, sat bool) uint8 {
	return f.table().reference(x, sat)
}

// refTable is a format's sorted finite non-negative codes, for the
// reference.
type refTable struct {
	codes      []uint8
	vals       []float64
	beyond     float64
	beyondEven bool
	hasInf     bool
	cand       []float64 // vals, then beyond
}

func (f refFormat) table() *refTable {
	t := &refTable{hasInf: f.hasInf}
	t.codes, t.vals, t.beyond, t.beyondEven = f.positives()
	t.cand = append(t.vals[:len(t.vals):len(t.vals)], t.beyond)
	return t
}

func (t *refTable) reference(x float32, sat bool) uint8 {
	codes, vals, beyond, beyondEven := t.codes, t.vals, t.beyond, t.beyondEven
	var sign uint8
	if math.Signbit(float64(x)) {
		sign = 0x80
	}
	a := math.Abs(float64(x))
	maxCode := codes[len(codes)-1]
	over := uint8(0x7f) // NaN
	if t.hasInf {
		over = 0x7c
	}
	switch {
	case math.IsNaN(a):
		return sign | 0x7f
	case math.IsInf(a, 0):
		if sat {
			return sign | maxCode
		}
		return sign | over
	}
	cand := t.cand
	even := func(i int) bool {
		if i == len(vals) {
			return beyondEven
		}
		return codes[i]&1 == 0
	}
	// The two candidates around a: the first at or above it and the
	// one before.
	hi := sort.SearchFloat64s(cand, a)
	best := min(hi, len(cand)-1)
	if hi > 0 {
		lo := hi - 1
		dl, dh := a-cand[lo], math.Abs(cand[best]-a)
		if dl < dh || dl == dh && even(lo) {
			best = lo
		}
	}
	if best == len(vals) || a > beyond {
		if sat {
			return sign | maxCode
		}
		return sign | over
	}
	return sign | codes[best]
}

// fp8Inputs returns float32 inputs covering every class of an 8-bit
// conversion: zeros, float32 subnormals, every code's value, the
// midpoints between neighbouring codes (the ties) and the float32
// neighbours of values and midpoints, the largest value, the first
// overflowing values, huge values, infinities, NaNs, and a dense sweep:
// every float32 whose upper 20 bits are anything, with three kinds of
// lower bits.
func fp8Inputs(f refFormat) []float32 {
	_, vals, beyond, _ := f.positives()
	var pos []float32
	add := func(v float64) {
		x := float32(v)
		pos = append(pos, x, math.Nextafter32(x, 0), math.Nextafter32(x, float32(math.Inf(1))))
	}
	for i, v := range vals {
		add(v)
		if i+1 < len(vals) {
			add((v + vals[i+1]) / 2)
		}
	}
	add(beyond)
	add((vals[len(vals)-1] + beyond) / 2)
	add(2 * beyond)
	add(vals[1] / 2)
	add(vals[1] / 4)
	pos = append(pos, math.Float32frombits(1), math.Float32frombits(0x007fffff), math.SmallestNonzeroFloat32,
		math.MaxFloat32, float32(math.Inf(1)), math.Float32frombits(0x7fc00000), math.Float32frombits(0x7f800001))
	rng := rand.New(rand.NewPCG(8, 8))
	for hi := uint32(0); hi < 1<<19; hi++ {
		for _, lo := range []uint32{0, 0xfff, rng.Uint32N(1 << 12)} {
			pos = append(pos, math.Float32frombits(hi<<12|lo))
		}
	}
	out := make([]float32, 0, 2*len(pos))
	for _, x := range pos {
		out = append(out, x, -x)
	}
	return out
}

func TestFloat8DecodesEveryCode(t *testing.T) {
	for _, f := range refFormats {
		for c := 0; c < 256; c++ {
			want, nan, _ := f.decode(uint8(c))
			got := f.to(uint8(c))
			if nan {
				if !math.IsNaN(float64(got)) {
					t.Errorf("%s: code %#02x decodes to %g, want NaN", f.name, c, got)
				}
				continue
			}
			if float64(got) != want || math.Signbit(float64(got)) != (c&0x80 != 0) {
				t.Errorf("%s: code %#02x decodes to %g, want %g", f.name, c, got, want)
			}
			// Every finite code and infinity converts back to itself.
			if back := f.from(got); back != uint8(c) {
				t.Errorf("%s: code %#02x (%g) converts back to %#02x", f.name, c, got, back)
			}
		}
	}
}

func TestFloat8MatchesReference(t *testing.T) {
	for _, f := range refFormats {
		inputs := fp8Inputs(f)
		ref := f.table()
		for _, sat := range []bool{false, true} {
			conv := f.from
			if sat {
				conv = f.fromSat
			}
			bad := 0
			for _, x := range inputs {
				got, want := conv(x), ref.reference(x, sat)
				if got != want {
					bad++
					if bad <= 5 {
						t.Errorf("%s sat=%v: %#08x (%g) → %#02x, want %#02x", f.name, sat, math.Float32bits(x), x, got, want)
					}
				}
			}
			if bad > 0 {
				t.Errorf("%s sat=%v: %d of %d inputs wrong", f.name, sat, bad, len(inputs))
			}
		}
	}
}

func TestFloat8Specials(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	for _, c := range []struct {
		conv func(float32) uint8
		name string
		in   float32
		want uint8
	}{
		{Float32ToE4M3, "e4m3 448", 448, 0x7e},
		{Float32ToE4M3, "e4m3 464 (tie) → 448", 464, 0x7e},
		{Float32ToE4M3, "e4m3 above 464 → NaN", math.Nextafter32(464, inf), 0x7f},
		{Float32ToE4M3Sat, "e4m3 sat 1e6 → 448", 1e6, 0x7e},
		{Float32ToE4M3Sat, "e4m3 sat -Inf → -448", -inf, 0xfe},
		{Float32ToE4M3, "e4m3 Inf → NaN", inf, 0x7f},
		{Float32ToE4M3, "e4m3 -NaN", -nan, 0xff},
		{Float32ToE4M3, "e4m3 smallest subnormal", 0x1p-9, 0x01},
		{Float32ToE4M3, "e4m3 half the smallest (tie) → 0", 0x1p-10, 0x00},
		{Float32ToE4M3, "e4m3 above half → smallest", math.Nextafter32(0x1p-10, 1), 0x01},
		{Float32ToE4M3, "e4m3 -tiny → -0", -1e-30, 0x80},
		{Float32ToE4M3, "e4m3 1.0625 (tie) → 1", 1.0625, 0x38},
		{Float32ToE4M3, "e4m3 1.1875 (tie) → 1.25", 1.1875, 0x3a},
		{Float32ToE5M2, "e5m2 57344", 57344, 0x7b},
		{Float32ToE5M2, "e5m2 below 61440", math.Nextafter32(61440, 0), 0x7b},
		{Float32ToE5M2, "e5m2 61440 (tie) → Inf", 61440, 0x7c},
		{Float32ToE5M2Sat, "e5m2 sat 61440 → max", 61440, 0x7b},
		{Float32ToE5M2Sat, "e5m2 sat Inf → max", inf, 0x7b},
		{Float32ToE5M2, "e5m2 -Inf", -inf, 0xfc},
		{Float32ToE5M2, "e5m2 NaN", nan, 0x7f},
		{Float32ToE5M2, "e5m2 smallest subnormal", 0x1p-16, 0x01},
		{Float32ToE5M2, "e5m2 1.5·2^-16 (tie) → 2·2^-16", 0x1.8p-16, 0x02},
	} {
		if got := c.conv(c.in); got != c.want {
			t.Errorf("%s: got %#02x, want %#02x", c.name, got, c.want)
		}
	}
}

// TestFloat8ReferenceCanFail guards the reference itself: a conversion
// that truncates instead of rounding disagrees with it.
func TestFloat8ReferenceCanFail(t *testing.T) {
	f := refFormats[0]
	truncate := func(x float32) uint8 { return Float32ToE4M3(math.Float32frombits(math.Float32bits(x) &^ 0xfffff)) }
	bad := 0
	for _, x := range []float32{1.07, 1.2, 3.3, 100, 300} {
		if truncate(x) != f.reference(x, false) {
			bad++
		}
	}
	if bad == 0 {
		t.Fatal(fmt.Sprint("the reference accepts truncation"))
	}
}
