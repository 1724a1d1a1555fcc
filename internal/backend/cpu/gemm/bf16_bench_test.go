package gemm

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/titan-go/titan/internal/backend/cpu/workpool"
)

// linearShapes are the multiplications of the linear layers of the
// Llama flavors tiny_bench and debug (configs/llama3.toml: dim 256, FFN
// 768, vocabulary 2000 and 2048) for one micro-batch of 8×256 = 2048
// tokens: for each weight W [out, in], the forward out = x·Wᵀ (NT), the
// backward to the input dx += dout·W (NN) and to the weight
// dW += doutᵀ·x (TN). bench/gemm_bf16/compare.sh times PyTorch on the
// same list (printed by TestPrintLinearShapes).
var linearShapes = func() []benchShape {
	const tokens = 2048
	var out []benchShape
	for _, w := range []struct{ out, in int }{{256, 256}, {768, 256}, {256, 768}, {2000, 256}, {2048, 256}} {
		out = append(out,
			benchShape{transB: true, m: tokens, n: w.out, k: w.in},
			benchShape{m: tokens, n: w.in, k: w.out, beta: 1},
			benchShape{transA: true, m: w.out, n: w.in, k: tokens, beta: 1})
	}
	return out
}()

// BenchmarkLinear times the float32 GEMM (Sgemm, default kernel) and the
// bf16 GEMM (GemmBF16, default kernel, bfloat16 operands as a
// mixed-precision step holds them) side by side on linearShapes, on 1 and
// 2 workers: threads=T/f32/SHAPE and threads=T/bf16/SHAPE. The bf16 rows
// with float32 operands (rounded while packing) are bf16f32/SHAPE; the
// forward products into a bfloat16 C (the output layer's
// logits under mixed precision) are bf16c/SHAPE.
func BenchmarkLinear(b *testing.B) {
	for _, threads := range []int{1, 2} {
		p := workpool.New(threads)
		for _, s := range linearShapes {
			for _, kind := range []string{"f32", "bf16", "bf16f32", "bf16c"} {
				if kind == "bf16c" && s.beta != 0 {
					continue
				}
				b.Run(fmt.Sprintf("threads=%d/%s/%s", threads, kind, s.name()), func(b *testing.B) {
					benchLinear(b, p, s, kind)
				})
			}
		}
		p.Close()
	}
}

func benchLinear(b *testing.B, p *workpool.Pool, s benchShape, kind string) {
	rng := rand.New(rand.NewPCG(1, 1))
	lda := s.k
	if s.transA {
		lda = s.m
	}
	ldb := s.n
	if s.transB {
		ldb = s.k
	}
	a := randSlice(rng, s.m*s.k)
	bm := randSlice(rng, s.k*s.n)
	_, ah := roundedBF16(a)
	_, bh := roundedBF16(bm)
	c, ch := make([]float32, s.m*s.n), make([]uint16, s.m*s.n)
	run := func() {
		switch kind {
		case "f32":
			Sgemm(p, s.transA, s.transB, s.m, s.n, s.k, 1, a, lda, bm, ldb, s.beta, c, s.n)
		case "bf16":
			GemmBF16(p, s.transA, s.transB, s.m, s.n, s.k, 1, BF16(ah), lda, BF16(bh), ldb, s.beta, F32(c), s.n)
		case "bf16f32":
			GemmBF16(p, s.transA, s.transB, s.m, s.n, s.k, 1, F32(a), lda, F32(bm), ldb, s.beta, F32(c), s.n)
		case "bf16c":
			GemmBF16(p, s.transA, s.transB, s.m, s.n, s.k, 1, BF16(ah), lda, BF16(bh), ldb, s.beta, BF16(ch), s.n)
		}
	}
	run()
	for b.Loop() {
		run()
	}
	b.ReportMetric(2*float64(s.m)*float64(s.n)*float64(s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkMicroBF16 times the GemmBF16 micro-kernels alone on packed
// operands in the caches, as BenchmarkMicro does for Sgemm's.
func BenchmarkMicroBF16(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 3))
	for _, kern := range bf16Kernels {
		kc, mc := kern.kc, kern.mc
		kw := kern.words(kc)
		a := randSlice(rng, kw*mc)
		bp := randSlice(rng, kw*kern.nr)
		if kern.kpack == 2 { // words of two small bfloat16 values
			for i := range a {
				a[i], bp[i%len(bp)] = 1, 1
			}
		}
		c := make([]float32, mc*kern.nr)
		b.Run(kern.name, func(b *testing.B) {
			for b.Loop() {
				for ir := 0; ir < mc; ir += kern.mr {
					kern.micro(kw, a[ir*kw:], bp, c[ir*kern.nr:], kern.nr, 1, 1, kern.mr, kern.nr)
				}
			}
			b.ReportMetric(2*float64(mc*kern.nr*kc)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// TestPrintLinearShapes prints linearShapes for bench/gemm_bf16 when
// TITAN_PRINT_SHAPES is set: one line "name transA transB m n k beta".
func TestPrintLinearShapes(t *testing.T) {
	if testingPrintShapes() {
		for _, s := range linearShapes {
			fmt.Printf("%s %d %d %d %d %d %g\n", s.name(), boolIndex(s.transA), boolIndex(s.transB), s.m, s.n, s.k, s.beta)
		}
	}
}

func testingPrintShapes() bool { return os.Getenv("TITAN_PRINT_SHAPES") != "" }
