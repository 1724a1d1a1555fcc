package cpu

import (
	"fmt"
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
	outH := be.Alloc(backend.BFloat16, n)
	// bf16-out: bfloat16 products and output, as mixed precision runs it.
	for _, c := range []struct {
		prefix string
		bf16   bool
		out    backend.Tensor
	}{{"", false, out}, {"bf16/", true, out}, {"bf16-out/", true, outH}} {
		d := d
		d.BF16 = c.bf16
		b.Run(c.prefix+"forward", func(b *testing.B) {
			for b.Loop() {
				be.AttentionForward(c.out, lse, q, k, v, d)
			}
			reportGFLOPs(b, benchAttnFwdFlops)
		})
		b.Run(c.prefix+"forward+backward", func(b *testing.B) {
			for b.Loop() {
				be.AttentionForward(c.out, lse, q, k, v, d)
				be.AttentionBackward(dq, dk, dv, dout, q, k, v, c.out, lse, d)
			}
			reportGFLOPs(b, benchAttnTotalFlops)
		})
	}
}

func BenchmarkCrossEntropy(b *testing.B) {
	be := New(0)
	defer be.Close()
	r := newRand(2)
	logits := randF32(r, benchN*benchVocab, 4)
	tg := make([]int32, benchN)
	for i := range tg {
		tg[i] = int32(r.IntN(benchVocab))
	}
	lt, targets := upload(be, logits), uploadI32(be, tg)
	stats, losses := be.Alloc(backend.Float32, 3*benchN), be.Alloc(backend.Float32, benchN)
	b.Run("forward", func(b *testing.B) {
		for b.Loop() {
			be.CrossEntropyReset(stats, benchN)
			be.CrossEntropyChunk(stats, lt, targets, benchN, benchVocab, 0)
			be.CrossEntropyLoss(losses, stats, targets, benchN)
		}
	})
	b.Run("forward+backward", func(b *testing.B) {
		for b.Loop() {
			be.CrossEntropyReset(stats, benchN)
			be.CrossEntropyChunk(stats, lt, targets, benchN, benchVocab, 0)
			be.CrossEntropyLoss(losses, stats, targets, benchN)
			be.CrossEntropyChunkBackward(lt, stats, targets, benchN, benchVocab, 0, 1.0/benchN)
			b.StopTimer()
			be.Upload(lt, logits)
			b.StartTimer()
		}
	})
}

// BenchmarkRMSNorm times RMSNorm forward+backward on the tiny_bench
// shape (2048 rows of 256) and a larger model's (512 rows of 4096), with
// the scalar code (scalar) and the vector kernels (vector).
func BenchmarkRMSNorm(b *testing.B) {
	be := New(0)
	defer be.Close()
	for _, sh := range []struct{ N, C int }{{benchN, benchDim}, {512, 4096}} {
		r := newRand(3)
		n := sh.N * sh.C
		x, w, d := upload(be, randF32(r, n, 1)), upload(be, randF32(r, sh.C, 1)), upload(be, randF32(r, n, 1))
		out, rstd := be.Alloc(backend.Float32, n), be.Alloc(backend.Float32, sh.N)
		dx, dw := be.Alloc(backend.Float32, n), be.Alloc(backend.Float32, sh.C)
		b.Run(fmt.Sprintf("N%dxC%d", sh.N, sh.C), func(b *testing.B) {
			benchVector(b, &useRMSNormAVX512, func() {
				be.RMSNormForward(out, rstd, x, w, sh.N, sh.C, 1e-5)
				be.RMSNormBackward(dx, dw, d, x, w, rstd, sh.N, sh.C)
			})
		})
	}
}

func BenchmarkSwiGLU(b *testing.B) {
	be := New(0)
	defer be.Close()
	r := newRand(4)
	n := benchN * benchFFN
	g, u, d := upload(be, randF32(r, n, 3)), upload(be, randF32(r, n, 1)), upload(be, randF32(r, n, 1))
	out, dg, du := be.Alloc(backend.Float32, n), be.Alloc(backend.Float32, n), be.Alloc(backend.Float32, n)
	benchVector(b, &useSwiGLUAVX512, func() {
		be.SwiGLUForward(out, g, u, n)
		be.SwiGLUBackward(dg, du, d, g, u, n)
	})
}

// benchVector runs f as sub-benchmarks scalar and vector, with *sw
// cleared and set, so that one run (with -count to alternate) compares
// them under the same load.
func benchVector(b *testing.B, sw *bool, f func()) {
	has := *sw
	if !has {
		b.Log("no vector kernel on this machine: vector runs the scalar code")
	}
	for _, mode := range []struct {
		name string
		on   bool
	}{{"scalar", false}, {"vector", has}} {
		b.Run(mode.name, func(b *testing.B) {
			withSwitch(sw, mode.on, func() {
				for b.Loop() {
					f()
				}
			})
		})
	}
}

func BenchmarkRoPE(b *testing.B) {
	be := New(0)
	defer be.Close()
	r := newRand(5)
	n := benchN * benchDim
	x, d := upload(be, randF32(r, n, 1)), upload(be, randF32(r, n, 1))
	cs, sn := upload(be, randF32(r, benchT*benchHD/2, 1)), upload(be, randF32(r, benchT*benchHD/2, 1))
	dx := be.Alloc(backend.Float32, n)
	benchVector(b, &useRoPEAVX512, func() {
		be.RoPEForward(x, x, cs, sn, benchB, benchT, benchNH, benchHD)
		be.RoPEBackward(dx, d, cs, sn, benchB, benchT, benchNH, benchHD)
	})
}

func BenchmarkEmbedding(b *testing.B) {
	be := New(0)
	defer be.Close()
	r := newRand(6)
	tg := make([]int32, benchN)
	for i := range tg {
		tg[i] = int32(r.IntN(benchVocab))
	}
	tok := uploadI32(be, tg)
	table := upload(be, randF32(r, benchVocab*benchDim, 1))
	out, dtab := be.Alloc(backend.Float32, benchN*benchDim), be.Alloc(backend.Float32, benchVocab*benchDim)
	for b.Loop() {
		be.EmbeddingForward(out, table, tok, benchN, benchDim)
		be.EmbeddingBackward(dtab, out, tok, benchN, benchDim)
	}
}

func BenchmarkAdamW(b *testing.B) {
	be := New(0)
	defer be.Close()
	r := newRand(7)
	n := benchAdamWElements
	p, g := upload(be, randF32(r, n, 1)), upload(be, randF32(r, n, 1))
	m, v := be.Alloc(backend.Float32, n), be.Alloc(backend.Float32, n)
	step := 0
	for b.Loop() {
		step++
		be.AdamW(p, g, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1, step)
	}
	b.SetBytes(int64(n) * 4 * 4)
}

func BenchmarkSumSquares(b *testing.B) {
	be := New(0)
	defer be.Close()
	x := upload(be, randF32(newRand(8), benchAdamWElements, 1))
	for b.Loop() {
		be.SumSquares(x)
	}
	b.SetBytes(int64(x.Len) * 4)
}
