package float8

import "golang.org/x/sys/cpu"

// castAVX512 is castScaled on n elements, n a multiple of 16 (scales nil:
// scale for every element).
//
//go:noescape
func castAVX512(dst, src, scales *float32, scale float32, n int, p *formatParams)

// amaxAVX512 is the largest bit pattern of |x[i]| over n elements, n a
// multiple of 64.
//
//go:noescape
func amaxAVX512(x *float32, n int) uint32

// hasAVX512 says whether the vector casts run; tests turn it off to
// compare them with the scalar loops.
var hasAVX512 = cpu.X86.HasAVX512F

// castVec casts the leading multiple of 16 elements of src as castScaled
// does, with AVX-512 where the CPU has it, and returns how many.
func castVec(dst, src []float32, scale float32, scales []float32, f Format) int {
	n := len(src) &^ 15
	if !hasAVX512 || n == 0 {
		return 0
	}
	_ = dst[n-1]
	var ps *float32
	if scales != nil {
		_ = scales[n-1]
		ps = &scales[0]
	}
	castAVX512(&dst[0], &src[0], ps, scale, n, &params[f])
	return n
}

// amaxVec is the largest |x| bit pattern of the leading multiple of 64
// elements of x, and how many it covered.
func amaxVec(x []float32) (uint32, int) {
	n := len(x) &^ 63
	if !hasAVX512 || n == 0 {
		return 0, 0
	}
	return amaxAVX512(&x[0], n), n
}

// unscaleAVX512 is one row of Unscale on n elements, n a multiple of 16.
//
//go:noescape
func unscaleAVX512(out, src, ci *float32, ri, beta float32, n int)

// unscaleVec runs the leading multiple of 16 elements of one row of
// Unscale with AVX-512 where the CPU has it, and returns how many.
func unscaleVec(out, src, ci []float32, ri, beta float32) int {
	n := len(src) &^ 15
	if !hasAVX512 || n == 0 {
		return 0
	}
	_, _ = out[n-1], ci[n-1]
	unscaleAVX512(&out[0], &src[0], &ci[0], ri, beta, n)
	return n
}

// castE4M3AVX512 is CastE4M3 on n elements, n a multiple of 16.
//
//go:noescape
func castE4M3AVX512(dst *byte, src *float32, scale float32, n int)

// widenE4M3AVX512 is WidenE4M3 on n elements, n a multiple of 16, by
// lookups in table (e4m3Values).
//
//go:noescape
func widenE4M3AVX512(dst *float32, src *byte, n int, table *float32)

// castE4M3Vec runs the leading multiple of 16 elements of CastE4M3 with
// AVX-512 where the CPU has it, and returns how many.
func castE4M3Vec(dst []byte, src []float32, scale float32) int {
	n := len(src) &^ 15
	if !hasAVX512 || n == 0 {
		return 0
	}
	_ = dst[n-1]
	castE4M3AVX512(&dst[0], &src[0], scale, n)
	return n
}

// widenE4M3Vec is castE4M3Vec for WidenE4M3.
func widenE4M3Vec(dst []float32, src []byte) int {
	n := len(src) &^ 15
	if !hasAVX512 || n == 0 {
		return 0
	}
	_ = dst[n-1]
	widenE4M3AVX512(&dst[0], &src[0], n, &e4m3Values[0])
	return n
}

// amaxColsAVX512 folds |row| into the column maxima amax (bit patterns)
// for n elements, n a multiple of 16.
//
//go:noescape
func amaxColsAVX512(amax *uint32, row *float32, n int)

// amaxColsVec folds the leading multiple of 16 elements of row into amax
// with AVX-512 where the CPU has it, and returns how many.
func amaxColsVec(amax []uint32, row []float32) int {
	n := len(row) &^ 15
	if !hasAVX512 || n == 0 {
		return 0
	}
	_ = amax[n-1]
	amaxColsAVX512(&amax[0], &row[0], n)
	return n
}
