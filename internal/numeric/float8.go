package numeric

import "math"

// The OCP 8-bit floating-point formats (OCP 8-bit Floating Point
// Specification, as PyTorch's float8_e4m3fn and float8_e5m2):
//
//   - e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no
//     infinities, S.1111.111 is NaN, the largest value is 448.
//   - e5m2: sign, 5 exponent bits (bias 15), 2 mantissa bits; infinities
//     and NaNs as in IEEE 754, the largest value is 57344.
//
// Both have subnormals. Conversions from float32 round to nearest, ties to
// even. A value too large for the format overflows: to NaN in e4m3fn and
// to infinity in e5m2 (the formats' non-saturating conversions), or, in
// the Sat variants, to the largest value of its sign, as torchao's
// scaled casts (saturate=True) do; the Sat variants also map the
// infinities to the largest value. A NaN input gives the NaN S.1111111 of
// its sign in both formats.
const (
	// MaxE4M3 is the largest finite float8 e4m3fn value.
	MaxE4M3 = 448
	// MaxE5M2 is the largest finite float8 e5m2 value.
	MaxE5M2 = 57344
)

// fp8 describes one 8-bit format.
type fp8 struct {
	mbits   uint32 // mantissa bits
	bias    int32  // exponent bias
	maxCode uint32 // bit pattern of the largest finite value
	over    uint32 // bit pattern of a non-saturated overflow (NaN or Inf)
	inf     bool   // whether the format has infinities
}

var (
	e4m3 = fp8{mbits: 3, bias: 7, maxCode: 0x7e, over: 0x7f}
	e5m2 = fp8{mbits: 2, bias: 15, maxCode: 0x7b, over: 0x7c, inf: true}
)

// Float32ToE4M3 rounds x to the nearest float8 e4m3fn, ties to even;
// magnitudes above 464 (448 plus half its spacing) and infinities become
// NaN.
func Float32ToE4M3(x float32) uint8 { return e4m3.from(x, false) }

// Float32ToE4M3Sat is Float32ToE4M3 saturating: magnitudes above 448 and
// infinities become ±448.
func Float32ToE4M3Sat(x float32) uint8 { return e4m3.from(x, true) }

// Float32ToE5M2 rounds x to the nearest float8 e5m2, ties to even;
// magnitudes of at least 61440 (57344 plus half its spacing) become
// infinities.
func Float32ToE5M2(x float32) uint8 { return e5m2.from(x, false) }

// Float32ToE5M2Sat is Float32ToE5M2 saturating: magnitudes above 57344
// and infinities become ±57344.
func Float32ToE5M2Sat(x float32) uint8 { return e5m2.from(x, true) }

// E4M3ToFloat32 widens a float8 e4m3fn bit pattern to float32, exactly.
func E4M3ToFloat32(b uint8) float32 { return e4m3.to(b) }

// E5M2ToFloat32 widens a float8 e5m2 bit pattern to float32, exactly.
func E5M2ToFloat32(b uint8) float32 { return e5m2.to(b) }

// from converts x to the format f.
func (f fp8) from(x float32, sat bool) uint8 {
	u := math.Float32bits(x)
	sign := uint8(u>>24) & 0x80
	a := u & 0x7fffffff
	switch {
	case a > 0x7f800000: // NaN
		return sign | 0x7f
	case a == 0x7f800000: // infinity
		if sat {
			return sign | uint8(f.maxCode)
		}
		return sign | uint8(f.over)
	}
	// minNormal is the format's smallest normal value as float32 bits.
	minNormal := uint32(127-f.bias+1) << 23
	var code uint32
	if a < minNormal {
		// Subnormal range: adding 2^(23-shift) to |x| in float32 (RNE)
		// rounds |x| to a multiple of the smallest subnormal,
		// 2^(1-bias-mbits), which then sits in the low mantissa bits.
		magic := math.Float32frombits(uint32(127+23-(f.bias-1+int32(f.mbits))) << 23)
		code = math.Float32bits(math.Float32frombits(a)+magic) - math.Float32bits(magic)
	} else {
		shift := 23 - f.mbits
		// Rebias the exponent, then round the dropped bits to even.
		r := a - uint32(127-f.bias)<<23
		r += 1<<(shift-1) - 1 + (r>>shift)&1
		code = r >> shift
	}
	if code > f.maxCode {
		if sat {
			code = f.maxCode
		} else {
			code = f.over
		}
	}
	return sign | uint8(code)
}

// to widens the bit pattern b of format f to float32.
func (f fp8) to(b uint8) float32 {
	sign := uint32(b&0x80) << 24
	exp := int32(b>>f.mbits) & (1<<(7-f.mbits) - 1)
	mant := uint32(b) & (1<<f.mbits - 1)
	maxExp := int32(1)<<(7-f.mbits) - 1
	switch {
	case f.inf && exp == maxExp:
		if mant == 0 {
			return math.Float32frombits(sign | 0x7f800000)
		}
		return math.Float32frombits(sign | 0x7fc00000 | mant<<(23-f.mbits))
	case !f.inf && uint32(b&0x7f) == 0x7f:
		return math.Float32frombits(sign | 0x7fc00000 | mant<<(23-f.mbits))
	case exp == 0: // zero or subnormal: mant · 2^(1-bias-mbits), exact
		v := float32(mant) * math.Float32frombits(uint32(127+1-f.bias-int32(f.mbits))<<23)
		return math.Float32frombits(sign | math.Float32bits(v))
	}
	return math.Float32frombits(sign | uint32(exp-f.bias+127)<<23 | mant<<(23-f.mbits))
}
