// Package float8 is float8 training of linear layers as torchao's
// Float8Linear computes it, emulated exactly on the CPU: dynamic scales
// from each tensor's (or each row's) absolute maximum, casts to the OCP
// formats e4m3fn and e5m2 with round-to-nearest-even and saturation
// (internal/numeric), and matrix products of the float8 values with
// float32 accumulation, the scales applied to the float32 result. Every
// e4m3 and e5m2 value is a bfloat16, so a bfloat16 GEMM with float32
// accumulation multiplies them exactly; the package leaves the products
// to the caller and gives it the casts and the output scaling.
//
// The recipes are torchao's (Float8LinearRecipeName), for y = x·Wᵀ with
// x [N, in], W [out, in], dy [N, out]:
//
//   - tensorwise: one scale per tensor (max/amax, not rounded); x and W
//     in e4m3, dy in e5m2, in all three products (y, dx = dy·W,
//     dW = dyᵀ·x).
//   - rowwise: one scale per row of each operand along the product's
//     contracted dimension, rounded down to a power of two; x, W and dy
//     all in e4m3 (torchao uses e4m3 for dy with rowwise scales). y: x
//     per token, W per output channel; dx: dy per token, W per input
//     channel; dW: dy per output channel, x per input channel (both over
//     the tokens).
//   - rowwise_with_gw_hp: y as rowwise; dx with dy rowwise (e4m3) and W
//     tensorwise (e4m3, scale rounded to a power of two); dW in high
//     precision (the run's parameter precision, not float8).
package float8

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"

	"github.com/titan-go/titan/internal/numeric"
)

// Recipe is a float8 scaling recipe (float8.recipe_name).
type Recipe int

// Recipes.
const (
	Tensorwise Recipe = iota
	Rowwise
	RowwiseGWHP
)

// Recipes lists the recipe names in Recipe order.
var Recipes = []string{"tensorwise", "rowwise", "rowwise_with_gw_hp"}

func (r Recipe) String() string { return Recipes[r] }

// ParseRecipe parses float8.recipe_name; "" is tensorwise (torchao's
// default configuration).
func ParseRecipe(s string) (Recipe, error) {
	if s == "" {
		return Tensorwise, nil
	}
	for i, n := range Recipes {
		if s == n {
			return Recipe(i), nil
		}
	}
	return 0, fmt.Errorf("float8.recipe_name %q: want one of %s", s, strings.Join(Recipes, ", "))
}

// Config is the float8 conversion of a model's linear layers.
type Config struct {
	Recipe Recipe
	// FilterFQNs are substrings of the fully qualified names of linear
	// layers left in high precision ("output": the output projection).
	FilterFQNs []string
	// FSDPAllGather all-gathers the float8 layers' weights as e4m3 under
	// FSDP (enable_fsdp_float8_all_gather, tensorwise only), and
	// PrecomputeScales computes their scales in one all-reduce per step
	// (precompute_float8_dynamic_scale_for_fsdp); see internal/parallel/fsdp.
	FSDPAllGather, PrecomputeScales bool
}

// Converts reports whether the linear layer fqn (as "layers.0.attention.wq"
// or "output") computes in float8: no filter string is part of its name.
func (c *Config) Converts(fqn string) bool {
	if c == nil {
		return false
	}
	for _, f := range c.FilterFQNs {
		if f != "" && strings.Contains(fqn, f) {
			return false
		}
	}
	return true
}

// Format is a float8 format.
type Format uint8

// Formats.
const (
	E4M3 Format = iota // float8_e4m3fn: max 448
	E5M2               // float8_e5m2: max 57344
)

// Max is the largest finite value of f.
func (f Format) Max() float32 {
	if f == E5M2 {
		return numeric.MaxE5M2
	}
	return numeric.MaxE4M3
}

func (f Format) String() string {
	if f == E5M2 {
		return "e5m2"
	}
	return "e4m3"
}

// Round returns x rounded to the nearest f value, ties to even,
// saturating at ±Max (torchao clamps to the format's range before the
// cast); NaN stays NaN. It is numeric's saturating conversion there and
// back, computed on the float32 bits (TestRoundIsNumeric).
func (f Format) Round(x float32) float32 {
	p := &params[f]
	b := math.Float32bits(x)
	sign, a := b&0x80000000, b&^0x80000000
	switch {
	case a > 0x7f800000:
		return x // NaN
	case a < p.minNormal:
		// The format's subnormals are multiples of a fixed spacing; adding
		// and subtracting magic rounds to them, ties to even.
		y := (math.Float32frombits(a) + p.magic) - p.magic
		return math.Float32frombits(math.Float32bits(y) | sign)
	}
	a += p.half - 1 + (a>>p.shift)&1
	a &^= 1<<p.shift - 1
	a = min(a, p.max)
	return math.Float32frombits(a | sign)
}

// formatParams are a format's rounding constants on float32 bits.
type formatParams struct {
	minNormal uint32  // bits of the smallest normal value
	magic     float32 // subnormal spacing × 2^23
	shift     uint32  // float32 mantissa bits dropped
	half, max uint32  // half an ulp of the format; bits of Max
}

var params = [...]formatParams{
	E4M3: {minNormal: math.Float32bits(0x1p-6), magic: 0x1p14, shift: 20, half: 1 << 19, max: math.Float32bits(numeric.MaxE4M3)},
	E5M2: {minNormal: math.Float32bits(0x1p-14), magic: 0x1p7, shift: 21, half: 1 << 20, max: math.Float32bits(numeric.MaxE5M2)},
}

// minAmax is torchao's EPS: an all-zero tensor gets scale Max/1e-12.
const minAmax = 1e-12

// Scale is the scale torchao's amax_to_scale gives amax: f.Max() /
// max(amax, 1e-12) in float32, rounded down to a power of two with pow2.
func Scale(amax float32, f Format, pow2 bool) float32 {
	s := f.Max() / max(amax, minAmax)
	if pow2 && s > 0 && !math.IsInf(float64(s), 0) {
		_, e := math.Frexp(float64(s)) // s = m·2^e, m in [0.5, 1)
		s = float32(math.Ldexp(1, e-1))
	}
	return s
}

// Amax is the largest |x|
// (NaN if x has a NaN, as torch's amax), compared on the bits.
func Amax(x []float32) float32 {
	m, done := amaxVec(x)
	for _, v := range x[done:] {
		m = max(m, math.Float32bits(v)&^0x80000000)
	}
	return math.Float32frombits(m)
}

// Cast writes dst[i] = f.Round(src[i]·scale): the float8 values (as
// float32) of src scaled by scale.
func Cast(dst, src []float32, scale float32, f Format) {
	parallel(len(src), 1, func(lo, hi int) {
		castScaled(dst[lo:hi], src[lo:hi], scale, nil, f)
	})
}

// castScaled writes dst[i] = f.Round(src[i]·s) with s = scale, or
// scales[i] when scales is set: Round's arithmetic in one loop, without
// a call per element.
func castScaled(dst, src []float32, scale float32, scales []float32, f Format) {
	dst = dst[:len(src)]
	if done := castVec(dst, src, scale, scales, f); done > 0 {
		dst, src = dst[done:], src[done:]
		if scales != nil {
			scales = scales[done:]
		}
	}
	p := params[f]
	for i, v := range src {
		s := scale
		if scales != nil {
			s = scales[i]
		}
		b := math.Float32bits(v * s)
		sign, a := b&0x80000000, b&^0x80000000
		switch {
		case a > 0x7f800000:
			// NaN stays
		case a < p.minNormal:
			a = math.Float32bits((math.Float32frombits(a) + p.magic) - p.magic)
		default:
			a += p.half - 1 + (a>>p.shift)&1
			a &^= 1<<p.shift - 1
			a = min(a, p.max)
		}
		dst[i] = math.Float32frombits(a | sign)
	}
}

// parallel splits [0, n) items of cost work elements each into chunks run
// on all CPUs (one chunk when the work is small).
func parallel(n, work int, fn func(lo, hi int)) {
	p := runtime.GOMAXPROCS(0)
	if p == 1 || n*work < 1<<15 || n < 2 {
		fn(0, n)
		return
	}
	p = min(p, n)
	var wg sync.WaitGroup
	for k := 0; k < p; k++ {
		lo, hi := n*k/p, n*(k+1)/p
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	wg.Wait()
}

// RowAmax writes into amax [rows] the largest |x| of each row of src
// [rows, cols] (see Amax).
func RowAmax(amax, src []float32, rows, cols int) {
	parallel(rows, cols, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			amax[i] = Amax(src[i*cols : (i+1)*cols])
		}
	})
}

// ColAmax writes into amax [cols] the largest |x| of each column of src
// [rows, cols] (see Amax).
func ColAmax(amax, src []float32, rows, cols int) {
	bits := make([]uint32, cols)
	for i := 0; i < rows; i++ {
		row := src[i*cols : (i+1)*cols]
		done := amaxColsVec(bits, row)
		for j, v := range row[done:] {
			bits[done+j] = max(bits[done+j], math.Float32bits(v)&^0x80000000)
		}
	}
	for j, b := range bits {
		amax[j] = math.Float32frombits(b)
	}
}

// Scales writes into scales[i] the scale of amax[i] (see Scale).
func Scales(scales, amax []float32, f Format, pow2 bool) {
	for i, a := range amax {
		scales[i] = Scale(a, f, pow2)
	}
}

// CastRows casts each row i of src [rows, cols] into dst with its own
// scale scales[i] (from the row's amax: RowAmax, Scales).
func CastRows(dst, src []float32, rows, cols int, f Format, scales []float32) {
	parallel(rows, cols, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			castScaled(dst[i*cols:(i+1)*cols], src[i*cols:(i+1)*cols], scales[i], nil, f)
		}
	})
}

// CastCols casts each column j of src [rows, cols] into dst with its own
// scale scales[j] (from the column's amax: ColAmax, Scales).
func CastCols(dst, src []float32, rows, cols int, f Format, scales []float32) {
	parallel(rows, cols, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			castScaled(dst[i*cols:(i+1)*cols], src[i*cols:(i+1)*cols], 0, scales, f)
		}
	})
}

// Unscale turns the float32 product c [rows, cols] of two scaled float8
// operands into the product of the originals: c[i, j] · (1/rowScale[i]) ·
// (1/colScale[j]), as torch._scaled_mm applies the inverse scales to its
// float32 accumulator; a scale slice of one element is a tensorwise scale,
// used for every row or column. dst [rows, cols] (leading dimension ldc)
// becomes beta·dst + the unscaled c.
func Unscale(dst []float32, ldc int, c []float32, rows, cols int, rowScale, colScale []float32, beta float32) {
	inv := func(s []float32, i int) float32 {
		if len(s) == 1 {
			return 1 / s[0]
		}
		return 1 / s[i]
	}
	ci := make([]float32, cols)
	for j := range ci {
		ci[j] = inv(colScale, j)
	}
	parallel(rows, cols, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			ri := inv(rowScale, i)
			out := dst[i*ldc : i*ldc+cols]
			src := c[i*cols : (i+1)*cols]
			done := unscaleVec(out, src, ci, ri, beta)
			for j, v := range src[done:] {
				j += done
				// Each product rounded on its own (explicit conversions:
				// no fused multiply-add), as the vector loop computes.
				y := float32(v * float32(ri*ci[j]))
				if beta != 0 {
					y += float32(beta * out[j])
				}
				out[j] = y
			}
		}
	})
}

// CastE4M3 writes into dst[i] the e4m3fn bit pattern of src[i]·scale,
// rounded to nearest even and saturating (numeric.Float32ToE4M3Sat): the
// bytes of the float8 tensor whose values Cast(…, E4M3) gives as float32.
func CastE4M3(dst []byte, src []float32, scale float32) {
	dst = dst[:len(src)]
	done := castE4M3Vec(dst, src, scale)
	for i, v := range src[done:] {
		dst[done+i] = numeric.Float32ToE4M3Sat(v * scale)
	}
}

// e4m3Values are the float32 values of the e4m3fn bit patterns.
var e4m3Values = func() (t [256]float32) {
	for i := range t {
		t[i] = numeric.E4M3ToFloat32(uint8(i))
	}
	return t
}()

// WidenE4M3 writes into dst[i] the value of the e4m3fn bit pattern
// src[i], exactly.
func WidenE4M3(dst []float32, src []byte) {
	dst = dst[:len(src)]
	done := widenE4M3Vec(dst, src)
	for i, b := range src[done:] {
		dst[done+i] = e4m3Values[b]
	}
}
