package cpu

import (
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/numeric"
)

// TestGemmBF16: Gemm with a bfloat16 A or B multiplies the operands
// rounded to bfloat16, accumulating in float32: it matches a float64
// product of the rounded operands within float32 accumulation error, for
// every mix of float32 and bfloat16 operands and the transposes of a
// linear layer's forward and backward.
func TestGemmBF16(t *testing.T) {
	b := newTestBackend(t, 2)
	for _, tc := range []struct {
		transA, transB bool
		m, n, k        int
		beta           float32
		aBF16, bBF16   bool
	}{
		{false, true, 96, 80, 64, 0, false, true},    // out = x·Wᵀ, weight in bf16
		{false, false, 96, 64, 80, 1, true, true},    // dx += dout·W
		{true, false, 80, 64, 96, 1, true, false},    // dW += doutᵀ·x
		{false, true, 33, 17, 257, 0.5, true, false}, // odd sizes
		{true, true, 150, 140, 130, 0, true, true},   // split over the workers
		{false, false, 5, 7, 0, 0.5, true, true},     // k = 0: C = beta·C
	} {
		r := newRand(uint64(tc.m*7 + tc.k))
		a, bm, c := randF32(r, tc.m*tc.k, 1), randF32(r, tc.k*tc.n, 1), randF32(r, tc.m*tc.n, 1)
		lda, ldb := max(1, tc.k), tc.n
		if tc.transA {
			lda = tc.m
		}
		if tc.transB {
			ldb = max(1, tc.k)
		}
		ar, br := roundBF16s(a), roundBF16s(bm)
		want := f64s(c)
		refGemm(tc.transA, tc.transB, tc.m, tc.n, tc.k, 1, ar, lda, br, ldb, float64(tc.beta), want, tc.n)
		at, bt := upload(b, a), upload(b, bm)
		if tc.aBF16 {
			at = uploadBF16(b, a)
		}
		if tc.bBF16 {
			bt = uploadBF16(b, bm)
		}
		ct := upload(b, c)
		b.Gemm(tc.transA, tc.transB, tc.m, tc.n, tc.k, 1, at, lda, bt, ldb, tc.beta, ct, tc.n)
		// |a|, |b|, |c| <= 1: Σ|a·b| + |beta·c| <= k+1.
		checkClose(t, "C", download(b, ct), want, float64(tc.k+4)*0x1p-24*float64(tc.k+1), 0)
	}
}

// TestGemmBF16HalfC: GemmBF16 into a bfloat16 C (the output layer's
// logits under mixed precision) holds the rounding of its float32 C's
// result, started from the widened C, bit for bit: beta 0 and 1 on the
// shapes of the logits' forward (NT) and input gradient (NN), on 1 and 3
// threads; a short C is refused.
func TestGemmBF16HalfC(t *testing.T) {
	for _, threads := range []int{1, 3} {
		b := newTestBackend(t, threads)
		for _, tc := range []struct {
			transB  bool
			m, n, k int
			beta    float32
		}{{true, 96, 700, 64, 0}, {false, 96, 64, 700, 1}, {true, 5, 3, 0, 1}} {
			r := newRand(uint64(tc.m + tc.n))
			ldb := tc.n
			if tc.transB {
				ldb = max(1, tc.k)
			}
			a, bm := uploadBF16(b, randF32(r, tc.m*tc.k, 1)), upload(b, randF32(r, tc.k*tc.n, 1))
			c0 := roundBF16s(randF32(r, tc.m*tc.n, 1))
			c, ch := upload(b, c0), uploadBF16(b, c0)
			b.GemmBF16(false, tc.transB, tc.m, tc.n, tc.k, 1, a, max(1, tc.k), bm, ldb, tc.beta, c, tc.n)
			b.GemmBF16(false, tc.transB, tc.m, tc.n, tc.k, 1, a, max(1, tc.k), bm, ldb, tc.beta, ch, tc.n)
			sameRounding(t, "C", b, ch, download(b, c))
		}
		short := b.Alloc(backend.BFloat16, 5)
		mustPanic(t, "short bf16 C", func() { b.GemmBF16(false, false, 2, 3, 1, 1, short, 1, short, 3, 0, short, 3) }, "GemmBF16", "c has 5", "need 6")
	}
}

func TestGemmBF16Refuses(t *testing.T) {
	b := newTestBackend(t, 1)
	x := uploadBF16(b, make([]float32, 5))
	f := upload(b, make([]float32, 6))
	mustPanic(t, "short bf16 A", func() { b.Gemm(false, false, 3, 2, 2, 1, x, 2, f, 2, 0, f, 2) }, "Gemm", "a has 5", "need 6")
	mustPanic(t, "bf16 C", func() { b.Gemm(false, false, 1, 1, 1, 1, x, 1, f, 1, 0, x, 1) }, "Gemm", "c is bfloat16")
}

// roundBF16s returns x rounded to bfloat16, as float32.
func roundBF16s(x []float32) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = numeric.RoundBF16(v)
	}
	return out
}

// uploadBF16 uploads x rounded to bfloat16 into a new bfloat16 tensor.
func uploadBF16(b *Backend, x []float32) backend.Tensor {
	h := make([]uint16, len(x))
	numeric.Float32sToBF16(h, x)
	t := b.Alloc(backend.BFloat16, len(x))
	b.Upload(t, h)
	return t
}

// TestGemmBF16Float32Operands: GemmBF16 on two float32 operands rounds
// both to bfloat16: bit for bit Gemm with them uploaded as bfloat16, and
// not the float32 product.
func TestGemmBF16Float32Operands(t *testing.T) {
	b := newTestBackend(t, 2)
	const m, n, k = 40, 24, 72
	r := newRand(9)
	a, bm := randF32(r, m*k, 1), randF32(r, k*n, 1)
	got, want, f32 := b.Alloc(backend.Float32, m*n), b.Alloc(backend.Float32, m*n), b.Alloc(backend.Float32, m*n)
	b.GemmBF16(false, true, m, n, k, 1, upload(b, a), k, upload(b, bm), k, 0, got, n)
	b.Gemm(false, true, m, n, k, 1, uploadBF16(b, a), k, uploadBF16(b, bm), k, 0, want, n)
	b.Gemm(false, true, m, n, k, 1, upload(b, a), k, upload(b, bm), k, 0, f32, n)
	g, w, f := download(b, got), download(b, want), download(b, f32)
	differs := false
	for i := range g {
		if g[i] != w[i] {
			t.Fatalf("C[%d] = %g, want %g (the product of the rounded operands)", i, g[i], w[i])
		}
		differs = differs || g[i] != f[i]
	}
	if !differs {
		t.Fatal("GemmBF16 equals the float32 product: the operands were not rounded")
	}
}
