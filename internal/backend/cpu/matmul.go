package cpu

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu/gemm"
)

// sgemm runs gemm.Sgemm single-threaded, for use inside a parallel loop,
// with A, B and C given as a slice and the offset of the matrix's first
// element in it; gemm gets exactly the elements each matrix spans.
func sgemm(transA, transB bool, m, n, k int, alpha float32,
	a []float32, aOff, lda int, b []float32, bOff, ldb int, beta float32, c []float32, cOff, ldc int) {
	sa, sb, sc := gemmSpans("gemm", transA, transB, m, n, k, lda, ldb, ldc)
	gemm.Sgemm(nil, transA, transB, m, n, k, alpha,
		window(a, aOff, sa), lda, window(b, bOff, sb), ldb, beta, window(c, cOff, sc), ldc)
}

// matrixSpan is the number of elements a rows×cols row-major matrix with
// leading dimension ld occupies; it panics if ld is too small.
func matrixSpan(op, name string, rows, cols, ld int) int {
	if rows < 0 || cols < 0 {
		panic(fmt.Sprintf("cpu: %s: %s is %d×%d", op, name, rows, cols))
	}
	if ld < max(1, cols) {
		panic(fmt.Sprintf("cpu: %s: leading dimension %d of %s is below max(1, %d columns)", op, ld, name, cols))
	}
	if rows == 0 || cols == 0 {
		return 0
	}
	return (rows-1)*ld + cols
}

// gemmSpans returns the element counts A, B and C of one Gemm occupy.
func gemmSpans(op string, transA, transB bool, m, n, k, lda, ldb, ldc int) (sa, sb, sc int) {
	if transA {
		sa = matrixSpan(op, "A", k, m, lda)
	} else {
		sa = matrixSpan(op, "A", m, k, lda)
	}
	if transB {
		sb = matrixSpan(op, "B", n, k, ldb)
	} else {
		sb = matrixSpan(op, "B", k, n, ldb)
	}
	sc = matrixSpan(op, "C", m, n, ldc)
	return sa, sb, sc
}

// Gemm computes C = alpha*op(A)*op(B) + beta*C with gemm.Sgemm on all
// workers, or with gemm.GemmBF16 when A or B is bfloat16: then both
// operands are multiplied as bfloat16 (a float32 one rounded to nearest
// even while it is packed) with float32 accumulation into the float32 C.
func (b *Backend) Gemm(transA, transB bool, m, n, k int, alpha float32, a backend.Tensor, lda int, bm backend.Tensor, ldb int, beta float32, c backend.Tensor, ldc int) {
	const op = "Gemm"
	if isBF16(a) || isBF16(bm) {
		b.gemmBF16(op, transA, transB, m, n, k, alpha, a, lda, bm, ldb, beta, c, ldc, false)
		return
	}
	sa, sb, sc := gemmSpans(op, transA, transB, m, n, k, lda, ldb, ldc)
	as := f32n(op, "a", a, sa)
	bs := f32n(op, "b", bm, sb)
	cs := f32n(op, "c", c, sc)
	if m == 0 || n == 0 {
		return
	}
	gemm.Sgemm(b.pool, transA, transB, m, n, k, alpha, as, lda, bs, ldb, beta, cs, ldc)
}

// GemmBF16 computes C = alpha*op(A)*op(B) + beta*C with gemm.GemmBF16:
// both operands multiplied as bfloat16 (float32 ones rounded to nearest
// even while packed), float32 accumulation into the float32 C; or, into
// a bfloat16 C, float32 accumulation over all of K rounded to nearest
// even once.
func (b *Backend) GemmBF16(transA, transB bool, m, n, k int, alpha float32, a backend.Tensor, lda int, bm backend.Tensor, ldb int, beta float32, c backend.Tensor, ldc int) {
	b.gemmBF16("GemmBF16", transA, transB, m, n, k, alpha, a, lda, bm, ldb, beta, c, ldc, true)
}

// gemmBF16 is GemmBF16; halfC allows a bfloat16 C (Gemm's is float32).
func (b *Backend) gemmBF16(op string, transA, transB bool, m, n, k int, alpha float32, a backend.Tensor, lda int, bm backend.Tensor, ldb int, beta float32, c backend.Tensor, ldc int, halfC bool) {
	sa, sb, sc := gemmSpans(op, transA, transB, m, n, k, lda, ldb, ldc)
	ao := gemmOperand(op, "a", a, sa)
	bo := gemmOperand(op, "b", bm, sb)
	var co gemm.Operand
	if halfC && isBF16(c) {
		co = gemm.BF16(u16n(op, "c", c, sc))
	} else {
		co = gemm.F32(f32n(op, "c", c, sc))
	}
	if m == 0 || n == 0 {
		return
	}
	gemm.GemmBF16(b.pool, transA, transB, m, n, k, alpha, ao, lda, bo, ldb, beta, co, ldc)
}

// isBF16 reports whether t is a view of bfloat16 memory.
func isBF16(t backend.Tensor) bool { return t.Mem != nil && t.Mem.DType == backend.BFloat16 }

// gemmOperand returns the first n elements of t, float32 or bfloat16, as
// an operand of gemm.GemmBF16, panicking if it holds fewer or has another
// dtype.
func gemmOperand(op, name string, t backend.Tensor, n int) gemm.Operand {
	if !isBF16(t) {
		return gemm.F32(f32n(op, name, t, n))
	}
	return gemm.BF16(u16n(op, name, t, n))
}

// GemmStridedBatched runs batch independent Gemms with
// gemm.SgemmStridedBatched on all workers.
func (b *Backend) GemmStridedBatched(transA, transB bool, m, n, k int, alpha float32, a backend.Tensor, lda, strideA int, bm backend.Tensor, ldb, strideB int, beta float32, c backend.Tensor, ldc, strideC int, batch int) {
	const op = "GemmStridedBatched"
	if batch < 0 || strideA < 0 || strideB < 0 || strideC < 0 {
		panic(fmt.Sprintf("cpu: %s: negative batch %d or stride (%d, %d, %d)", op, batch, strideA, strideB, strideC))
	}
	if batch == 0 || m == 0 || n == 0 {
		return
	}
	sa, sb, sc := gemmSpans(op, transA, transB, m, n, k, lda, ldb, ldc)
	as := f32n(op, "a", a, batchSpan(strideA, batch, sa))
	bs := f32n(op, "b", bm, batchSpan(strideB, batch, sb))
	cs := f32n(op, "c", c, batchSpan(strideC, batch, sc))
	if sc > strideC && batch > 1 {
		panic(fmt.Sprintf("cpu: %s: C matrices overlap (span %d, stride %d)", op, sc, strideC))
	}
	if k == 0 {
		// Nothing to multiply: C = beta*C. (Done here because gemm's
		// batched driver slices the empty A and B per matrix.)
		for i := 0; i < batch; i++ {
			for r := 0; r < m; r++ {
				row := cs[i*strideC+r*ldc : i*strideC+r*ldc+n]
				if beta == 0 {
					clear(row)
				} else {
					scale(row, beta)
				}
			}
		}
		return
	}
	gemm.SgemmStridedBatched(b.pool, transA, transB, m, n, k, alpha, as, lda, strideA, bs, ldb, strideB, beta, cs, ldc, strideC, batch)
}

// batchSpan is the number of elements batch matrices of span elements,
// stride apart, occupy.
func batchSpan(stride, batch, span int) int {
	if span == 0 {
		return 0
	}
	return stride*(batch-1) + span
}

// window returns x[off:off+n], or nil when n is zero.
func window(x []float32, off, n int) []float32 {
	if n == 0 {
		return nil
	}
	return x[off : off+n : off+n]
}
