//go:build amd64

package cpu

import (
	"math"

	"golang.org/x/sys/cpu"
)

// Vector kernels (vec_amd64.s) for the loops that dominate the softmax,
// cross-entropy and SwiGLU: exponentials, sigmoids and row maxima.

// useAVX2 selects the vector kernels. Tests clear it to compare the
// scalar code, which gives the same bits.
var useAVX2 = cpu.X86.HasAVX2

// expConsts holds the constants of expAffineAVX2, each repeated across
// the eight lanes of a YMM register, in the order the kernel's offsets
// assume (row r at byte 32*r).
var expConsts = func() (k [12][expLanes]float32) {
	for r, v := range [12]float32{
		expLog2e, expMagic, expLn2Hi, expLn2Lo,
		expC6, expC5, expC4, expC3, expC2,
		1, expMin, expFast,
	} {
		for j := range k[r] {
			k[r][j] = v
		}
	}
	return k
}()

// expAffineAVX2 computes dst[i] = exp(a*src[i] + c) for blocks of eight
// elements, i < n (a multiple of eight), adding element j of each block
// to acc[j]. It stops before the first block holding an argument above
// expFast or NaN and returns the number of elements done.
//
//go:noescape
func expAffineAVX2(dst, src *float32, n int, a, c float32, acc *[expLanes]float32) int

// sigmoidAVX2 computes dst[i] = 1/(1 + exp(-src[i])) for blocks of eight
// elements, i < n (a multiple of eight), with the operations of
// 1/(1+expf(-x)). It stops before the first block holding an element below
// -expFast or NaN and returns the number of elements done.
//
//go:noescape
func sigmoidAVX2(dst, src *float32, n int) int

// maxAVX2 returns the largest of the n elements at x; n is a positive
// multiple of eight.
//
//go:noescape
func maxAVX2(x *float32, n int) float32

// sigmoidBlocks is expBlocks for sigmoid.
func sigmoidBlocks(dst, src []float32) int {
	if !useAVX2 || len(dst) == 0 {
		return 0
	}
	src = src[:len(dst)]
	return sigmoidAVX2(&dst[0], &src[0], len(dst))
}

// maxBlocks returns the largest element of x[:n] and n, the number of
// elements it covered (a multiple of expLanes, possibly 0).
func maxBlocks(x []float32) (float32, int) {
	n := len(x) &^ (expLanes - 1)
	if !useAVX2 || n == 0 {
		return float32(math.Inf(-1)), 0
	}
	return maxAVX2(&x[0], n), n
}

// expBlocks runs expAffine's full blocks through the vector kernel when
// the CPU has AVX2 (see expAffineAVX2); it returns the number of elements
// done, a multiple of expLanes.
func expBlocks(dst, src []float32, a, c float32, acc *[expLanes]float32) int {
	if !useAVX2 || len(dst) == 0 {
		return 0
	}
	src = src[:len(dst)]
	return expAffineAVX2(&dst[0], &src[0], len(dst), a, c, acc)
}
