package cpu

import (
	"testing"

	"github.com/titan-go/titan/internal/backend"
)

// refGemm computes C = alpha*op(A)*op(B) + beta*C in float64.
func refGemm(transA, transB bool, m, n, k int, alpha float64, a []float32, lda int, b []float32, ldb int, beta float64, c []float64, ldc int) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for l := 0; l < k; l++ {
				ia, ib := i*lda+l, l*ldb+j
				if transA {
					ia = l*lda + i
				}
				if transB {
					ib = j*ldb + l
				}
				av, bv := a[ia], b[ib]
				s += float64(av) * float64(bv)
			}
			c[i*ldc+j] = alpha*s + beta*c[i*ldc+j]
		}
	}
}

func TestGemm(t *testing.T) {
	b := newTestBackend(t, 3)
	for _, tc := range []struct {
		transA, transB bool
		m, n, k        int
		pad            int // extra leading-dimension elements
		alpha, beta    float32
		batch          int
	}{
		{false, false, 5, 7, 3, 0, 1, 0, 1},
		{true, false, 33, 17, 20, 3, 0.5, 1, 1},
		{false, true, 8, 9, 64, 1, -1, 2, 1},
		{true, true, 70, 65, 31, 0, 2, 0.25, 1},
		{false, true, 6, 5, 4, 2, 1, 1, 5},
		{true, false, 40, 30, 20, 0, 1, 0, 3},
		{false, false, 3, 3, 0, 1, 1, 0.5, 2},
	} {
		r := newRand(uint64(tc.m*1000 + tc.n))
		rowsA, colsA := tc.m, tc.k
		if tc.transA {
			rowsA, colsA = tc.k, tc.m
		}
		rowsB, colsB := tc.k, tc.n
		if tc.transB {
			rowsB, colsB = tc.n, tc.k
		}
		lda, ldb, ldc := colsA+tc.pad, colsB+tc.pad, tc.n+tc.pad
		sa, sb, sc := rowsA*lda, rowsB*ldb, tc.m*ldc
		a, bm, c := randF32(r, sa*tc.batch, 1), randF32(r, sb*tc.batch, 1), randF32(r, sc*tc.batch, 1)
		want := f64s(c)
		for i := 0; i < tc.batch; i++ {
			refGemm(tc.transA, tc.transB, tc.m, tc.n, tc.k, float64(tc.alpha), a[i*sa:], lda, bm[i*sb:], ldb, float64(tc.beta), want[i*sc:], ldc)
		}
		// Padding columns of C must be left alone.
		for i := 0; i < tc.batch*tc.m; i++ {
			for j := tc.n; j < ldc; j++ {
				want[i*ldc+j] = float64(c[i*ldc+j])
			}
		}
		ct := upload(b, c)
		if tc.batch == 1 {
			b.Gemm(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, upload(b, a), lda, upload(b, bm), ldb, tc.beta, ct, ldc)
		} else {
			b.GemmStridedBatched(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, upload(b, a), lda, sa, upload(b, bm), ldb, sb, tc.beta, ct, ldc, sc, tc.batch)
		}
		checkClose(t, "C", download(b, ct), want, 1e-5, 1e-5)
	}
}

func TestGemmTooShort(t *testing.T) {
	b := newTestBackend(t, 1)
	x := b.Alloc(backend.Float32, 5)
	mustPanic(t, "Gemm", func() { b.Gemm(false, false, 3, 2, 2, 1, x, 2, x, 2, 0, x, 2) }, "Gemm", "a has 5", "need 6")
	mustPanic(t, "batched", func() {
		b.GemmStridedBatched(false, false, 1, 1, 1, 1, x, 1, 1, x, 1, 1, 0, x, 1, 1, 6)
	}, "GemmStridedBatched", "need 6")
}
