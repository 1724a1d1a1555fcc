//go:build amd64

package cpu

import "golang.org/x/sys/cpu"

// Vector kernels (rmsnorm_amd64.s) for RMSNorm's row sums, row updates
// and weight-gradient column sums, with AVX-512.

// useRMSNormAVX512 selects the vector kernels. Tests and benchmarks clear
// it to run the scalar code, which gives the same bits.
var useRMSNormAVX512 = cpu.X86.HasAVX512F

// rmsDweightAVX512 keeps one strip's sums in sixteen registers of eight
// float64; it assumes rmsStrip is 128 (this fails to compile otherwise).
var _ = [1]struct{}{}[rmsStrip-128]

// rmsSumSquaresAVX512 returns rmsSumSquares of the n elements at x (n
// positive): lane l of one 16-lane register adds x[j]*x[j] for j ≡ l
// (mod 16) in order of j (the last partial block under a mask), and the
// lanes are combined as laneSum does.
//
//go:noescape
func rmsSumSquaresAVX512(x *float32, n int) float32

// rmsDot3AVX512 is rmsSumSquaresAVX512 for the terms (a[j]*b[j])*c[j]:
// rmsDot3 of n elements (n positive).
//
//go:noescape
func rmsDot3AVX512(a, b, c *float32, n int) float32

// rmsScaleAVX512 writes out[j] = (x[j]*r)*w[j] for j < n (a multiple of
// 16). out may alias x.
//
//go:noescape
func rmsScaleAVX512(out, x, w *float32, r float32, n int)

// rmsBackRowAVX512 adds (r*w[j])*d[j] - k*x[j] to dx[j] for j < n (a
// multiple of 16).
//
//go:noescape
func rmsBackRowAVX512(dx, d, x, w *float32, r, k float32, n int)

// rmsDweightAVX512 adds, for each column j < 8*groups (groups 1 to 16)
// and rows i = 0, ..., rows-1 in order, (float64(d[i*stride+j]) *
// float64(x[i*stride+j])) * float64(rs[i]) to acc[j] in float64.
//
//go:noescape
func rmsDweightAVX512(acc *[rmsStrip]float64, d, x, rs *float32, rows, stride, groups int)

// rmsSumSquaresVec returns rmsSumSquares(x) from the vector kernel and
// true, or false when the scalar code is to run.
func rmsSumSquaresVec(x []float32) (float32, bool) {
	if !useRMSNormAVX512 || len(x) == 0 {
		return 0, false
	}
	return rmsSumSquaresAVX512(&x[0], len(x)), true
}

// rmsDot3Vec is rmsSumSquaresVec for rmsDot3 (b and c as long as a).
func rmsDot3Vec(a, b, c []float32) (float32, bool) {
	if !useRMSNormAVX512 || len(a) == 0 {
		return 0, false
	}
	_, _ = b[len(a)-1], c[len(a)-1]
	return rmsDot3AVX512(&a[0], &b[0], &c[0], len(a)), true
}

// rmsScaleBlocks writes RMSNormForward's outputs for the leading multiple
// of 16 elements of a row with the vector kernel and returns how many.
func rmsScaleBlocks(out, x, w []float32, r float32) int {
	n := len(x) &^ 15
	if !useRMSNormAVX512 || n == 0 {
		return 0
	}
	_, _ = out[n-1], w[n-1]
	rmsScaleAVX512(&out[0], &x[0], &w[0], r, n)
	return n
}

// rmsBackRowBlocks updates RMSNormBackward's dinp for the leading multiple
// of 16 elements of a row with the vector kernel and returns how many.
func rmsBackRowBlocks(dx, d, x, w []float32, r, k float32) int {
	n := len(x) &^ 15
	if !useRMSNormAVX512 || n == 0 {
		return 0
	}
	_, _, _ = dx[n-1], d[n-1], w[n-1]
	rmsBackRowAVX512(&dx[0], &d[0], &x[0], &w[0], r, k, n)
	return n
}

// rmsDweightBlocks sums the leading multiple of eight columns of the strip
// [c0, c1) of d and x (N rows of C) into acc with the vector kernel and
// returns how many columns it did.
func rmsDweightBlocks(acc *[rmsStrip]float64, d, x, rs []float32, N, C, c0, c1 int) int {
	n := (c1 - c0) &^ 7
	if !useRMSNormAVX512 || n == 0 || N == 0 {
		return 0
	}
	last := (N-1)*C + c0 + n - 1
	_, _, _ = d[last], x[last], rs[N-1]
	rmsDweightAVX512(acc, &d[c0], &x[c0], &rs[0], N, C, n/8)
	return n
}
