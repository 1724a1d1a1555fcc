// Package gemm is the CPU single-precision matrix multiply behind the cpu
// backend.
//
// The driver follows the BLIS/GotoBLAS design: panels of op(A) and op(B)
// are packed into contiguous, 64-byte aligned buffers (the packing
// routines absorb the transposes), a loop nest over blocks of N, M and K
// keeps the packed blocks in the caches, and a register-blocked
// micro-kernel computes one tile of C at a time. The micro-kernel is
// chosen at run time from the CPU features (AVX-512, AVX2+FMA, or portable
// Go); see Kernels and SetKernel.
//
// GemmBF16 is the same multiplication on bfloat16 operands with float32
// accumulation, through the same driver: on CPUs with AVX512_BF16 a
// VDPBF16PS micro-kernel whose packing rounds float32 operands to
// bfloat16 (or copies bfloat16 ones), elsewhere the float32 kernels on
// operands rounded the same way; see BF16Kernels and SetBF16Kernel.
// GemmBF16 also writes a bfloat16 C: each work item accumulates its
// part of C over all of K in a float32 tile and rounds it once.
//
// Multiplications big enough to pay for it run on all workers of the
// given pool: the workers pack the B panel together, share it, and claim
// blocks of C one at a time, so that a worker slowed down by the rest of
// the machine holds the others up as little as possible. Sgemm must not
// be called from inside a task running on the same pool.
package gemm

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend/cpu/workpool"
	"github.com/titan-go/titan/internal/numeric"
)

// minParallelFlops is the work (2·m·n·k) below which a multiplication runs
// on the calling goroutine alone: waking the pool costs a few
// microseconds.
const minParallelFlops = 1 << 22

// Sgemm computes C = alpha*op(A)*op(B) + beta*C on row-major matrices,
// where op(A) is m×k, op(B) is k×n and C is m×n with leading dimensions
// lda, ldb, ldc. op(X) is X, or its transpose when transX is set, so A is
// stored m×k (k×m when transA) and B is stored k×n (n×k when transB).
// beta == 0 ignores the previous contents of C (NaNs too).
//
// p may be nil, which runs single-threaded. Sgemm panics if a dimension is
// negative, a leading dimension is too small or a slice is too short.
func Sgemm(p *workpool.Pool, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	checkArgs(transA, transB, m, n, k, len(a), lda, 0, len(b), ldb, 0, len(c), ldc, 0, 1)
	threads := 1
	if p != nil {
		threads = p.Size()
	}
	gemm(p, threads, active.Load(), transA, transB, m, n, k, alpha, a, nil, lda, b, nil, ldb, beta, c, nil, ldc)
}

// gemm runs one checked multiplication with up to threads workers of p.
// A is a, or ah when it is bfloat16 (a nil), and likewise for B and C.
func gemm(p *workpool.Pool, threads int, kern *kernel, transA, transB bool, m, n, k int, alpha float32, a []float32, ah []uint16, lda int, b []float32, bh []uint16, ldb int, beta float32, c []float32, ch []uint16, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		if ch != nil {
			scale(m, n, beta, ch, ldc)
		} else {
			scale(m, n, beta, c, ldc)
		}
		return
	}
	pl := newPlan(kern, threads, transA, transB, m, n, k, alpha, a, ah, lda, b, bh, ldb, beta, c, ch, ldc)
	if pl.nt > 1 {
		p.Run(pl.workFn)
	} else {
		pl.work(0)
	}
	pl.release()
}

// scale computes C = beta*C, writing zeros when beta == 0; a bfloat16 C
// (bit patterns) is widened, scaled in float32 and rounded to nearest
// even element by element.
func scale[E float32 | uint16](m, n int, beta float32, c []E, ldc int) {
	for i := 0; i < m; i++ {
		row := c[i*ldc : i*ldc+n]
		switch beta {
		case 0:
			clear(row)
		case 1:
		default:
			switch r := any(row).(type) {
			case []float32:
				for j := range r {
					r[j] *= beta
				}
			case []uint16:
				for j, h := range r {
					r[j] = numeric.Float32ToBF16(beta * numeric.BF16ToFloat32(h))
				}
			}
		}
	}
}

// checkArgs panics unless batch matrices of the given shape fit their
// slices. stride* are the element offsets between consecutive matrices.
func checkArgs(transA, transB bool, m, n, k, lenA, lda, strideA, lenB, ldb, strideB, lenC, ldc, strideC, batch int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("gemm: negative dimension m=%d n=%d k=%d", m, n, k))
	}
	if batch < 0 {
		panic(fmt.Sprintf("gemm: negative batch %d", batch))
	}
	rowsA, colsA := m, k
	if transA {
		rowsA, colsA = k, m
	}
	rowsB, colsB := k, n
	if transB {
		rowsB, colsB = n, k
	}
	checkMatrix("A", rowsA, colsA, lenA, lda, strideA, batch, false)
	checkMatrix("B", rowsB, colsB, lenB, ldb, strideB, batch, false)
	checkMatrix("C", m, n, lenC, ldc, strideC, batch, true)
}

// checkMatrix panics unless batch rows×cols matrices with leading
// dimension ld, stride elements apart, fit in length elements. An output
// must not have overlapping matrices.
func checkMatrix(name string, rows, cols, length, ld, stride, batch int, output bool) {
	if ld < max(1, cols) {
		panic(fmt.Sprintf("gemm: ld%s=%d less than max(1, %d)", lowerName(name), ld, cols))
	}
	if stride < 0 {
		panic(fmt.Sprintf("gemm: negative stride%s=%d", name, stride))
	}
	if rows == 0 || cols == 0 || batch == 0 {
		return
	}
	extent := (rows-1)*ld + cols
	if output && batch > 1 && stride < extent {
		panic(fmt.Sprintf("gemm: stride%s=%d less than the %d elements of one %d×%d matrix", name, stride, extent, rows, cols))
	}
	if need := (batch-1)*stride + extent; length < need {
		panic(fmt.Sprintf("gemm: len(%s)=%d less than the %d elements needed by %d %d×%d matrices (ld=%d, stride=%d)",
			lowerName(name), length, need, batch, rows, cols, ld, stride))
	}
}

func lowerName(name string) string {
	switch name {
	case "A":
		return "a"
	case "B":
		return "b"
	}
	return "c"
}
