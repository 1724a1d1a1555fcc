package cpu

import (
	"testing"

	"github.com/titan-go/titan/internal/backend"
)

// The benchmarks use the shapes of the small Llama training step the
// backend is tuned for: dim 256, 4 heads of 64, FFN 768, vocabulary 2000,
// batch 8 of 256 tokens (N = 2048 rows).
const (
	benchB, benchT      = 8, 256
	benchNH, benchHD    = 4, 64
	benchN              = benchB * benchT
	benchDim, benchFFN  = benchNH * benchHD, 768
	benchVocab          = 2000
	benchAdamWElements  = 1 << 22
	benchCausalPairs    = benchT * (benchT + 1) / 2
	benchAttnFwdFlops   = 4 * benchHD * benchCausalPairs * benchB * benchNH // QK^T and PV
	benchAttnTotalFlops = benchAttnFwdFlops * 7 / 2                         // backward: 5 products
)

func reportGFLOPs(b *testing.B, flops float64) {
	b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkAttention times the attention forward and forward+backward
// in float32 and (bf16/...) with BF16 products.
func BenchmarkAttention(b *testing.B) {
	be := New(0)
	defer be.Close()
	d := backend.AttentionDims{B: benchB, Tq: benchT, Tk: benchT, NH: benchNH, NKV: benchNH, HD: benchHD}
	r := newRand(1)
	n := benchN * benchDim
	q, k, v := upload(be, randF32(r, n, 1)), upload(be, randF32(r, n, 1)), upload(be, randF32(r, n, 1))
	dout := upload(be, randF32(r, n, 1))
	out, lse := be.Alloc(backend.Float32, n), be.Alloc(backend.Float32, benchB*benchNH*benchT)
	dq, dk, dv := be.Alloc(backend.Float32, n), be.Alloc(backend.Float32, n), be.Alloc(backend.Float32, n)
	for _, bf16 := range []bool{false, true} {
		d := d
		d.BF16 = bf16
		prefix := ""
		if bf16 {
			prefix = "bf16/"
		}
		b.Run(prefix+"forward", func(b *testing.B) {
			for b.Loop() {
				be.AttentionForward(out, lse, q, k, v, d)
			}
			reportGFLOPs(b, benchAttnFwdFlops)
		})
		b.Run(prefix+"forward+backward", func(b *testing.B) {
			for b.Loop() {
				be.AttentionForward(out, lse, q, k, v, d)
				be.AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse, d)
			}
			reportGFLOPs(b, benchAttnTotalFlops)
		})
	}
}
