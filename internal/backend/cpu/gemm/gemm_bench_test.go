package gemm

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/titan-go/titan/internal/backend/cpu/workpool"
)

// benchShape is one benchmarked multiplication. bench/openblas/sgemm_bench.c
// times the same list under the same names.
type benchShape struct {
	transA, transB bool
	m, n, k        int
	beta           float32
	batch          int // 0: a plain Sgemm; > 0: SgemmStridedBatched
}

// name is, e.g., "NT_2048x768x768", "TN_768x768x2048_acc" (beta = 1) or
// "bNT_24x256x256x64" (24 matrices of 256×256×64).
func (s benchShape) name() string {
	op := string("NT"[boolIndex(s.transA)]) + string("NT"[boolIndex(s.transB)])
	dims := fmt.Sprintf("%dx%dx%d", s.m, s.n, s.k)
	if s.batch > 0 {
		op = "b" + op
		dims = fmt.Sprintf("%dx%s", s.batch, dims)
	}
	name := op + "_" + dims
	if s.beta != 0 {
		name += "_acc"
	}
	return name
}

func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}

var benchShapes = []benchShape{
	{m: 1024, n: 1024, k: 1024},
	{m: 4096, n: 5632, k: 2048},
	// Linear layer forward with 2048 tokens: out = inp·Wᵀ.
	{transB: true, m: 2048, n: 768, k: 768},
	{transB: true, m: 2048, n: 2000, k: 768},
	{transB: true, m: 2048, n: 768, k: 2000},
	{transB: true, m: 2048, n: 256, k: 768},
	// Backward to the input: dinp += dout·W.
	{m: 2048, n: 768, k: 2000, beta: 1},
	{m: 2048, n: 2000, k: 768, beta: 1},
	{m: 2048, n: 768, k: 256, beta: 1},
	// Backward to the weight: dW += doutᵀ·inp.
	{transA: true, m: 768, n: 768, k: 2048, beta: 1},
	{transA: true, m: 2000, n: 768, k: 2048, beta: 1},
	{transA: true, m: 768, n: 2000, k: 2048, beta: 1},
	{transA: true, m: 256, n: 768, k: 2048, beta: 1},
	// Attention tiles: scores = q·kᵀ and out = att·v per head.
	{transB: true, m: 256, n: 256, k: 64, batch: 24},
	{m: 256, n: 64, k: 256, batch: 24},
	{transB: true, m: 64, n: 64, k: 64, batch: 96},
}

// BenchmarkSgemm times every supported kernel on the benchmark shapes
// with workpool.DefaultThreads() workers (TITAN_NUM_THREADS).
func BenchmarkSgemm(b *testing.B) {
	p := workpool.New(0)
	defer p.Close()
	saved := Kernel()
	defer SetKernel(saved)
	for _, kname := range Kernels() {
		for _, s := range benchShapes {
			b.Run(kname+"/"+s.name(), func(b *testing.B) {
				if err := SetKernel(kname); err != nil {
					b.Fatal(err)
				}
				benchOne(b, p, s)
			})
		}
	}
}

func benchOne(b *testing.B, p *workpool.Pool, s benchShape) {
	rng := rand.New(rand.NewPCG(1, 1))
	lda := s.k
	if s.transA {
		lda = s.m
	}
	ldb := s.n
	if s.transB {
		ldb = s.k
	}
	count := max(1, s.batch)
	sa, sb, sc := s.m*s.k, s.k*s.n, s.m*s.n
	a := randSlice(rng, count*sa)
	bm := randSlice(rng, count*sb)
	c := make([]float32, count*sc)
	flops := 2 * float64(s.m) * float64(s.n) * float64(s.k) * float64(count)
	run := func() {
		if s.batch > 0 {
			SgemmStridedBatched(p, s.transA, s.transB, s.m, s.n, s.k, 1, a, lda, sa, bm, ldb, sb, s.beta, c, s.n, sc, s.batch)
		} else {
			Sgemm(p, s.transA, s.transB, s.m, s.n, s.k, 1, a, lda, bm, ldb, s.beta, c, s.n)
		}
	}
	run() // warm up: fault in C's pages, fill the buffer pools
	for b.Loop() {
		run()
	}
	b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkPack times the packing routines of every kernel on one
// 256-deep panel of its micro-panel widths.
func BenchmarkPack(b *testing.B) {
	const kc, ld = 256, 1024
	rng := rand.New(rand.NewPCG(2, 2))
	src := randSlice(rng, kc*ld)
	for _, kern := range kernels {
		for _, lanes := range []int{kern.mr, kern.nr} {
			dst := make([]float32, kc*lanes)
			b.Run(fmt.Sprintf("%s/trans/lanes=%d", kern.name, lanes), func(b *testing.B) {
				for b.Loop() {
					kern.transPack(dst, src, ld, lanes, lanes, kc)
				}
				b.ReportMetric(float64(kc*lanes*b.N)/b.Elapsed().Seconds()/1e9, "Gelem/s")
			})
			b.Run(fmt.Sprintf("%s/copy/lanes=%d", kern.name, lanes), func(b *testing.B) {
				for b.Loop() {
					kern.copyPack(dst, src, ld, lanes, kc, lanes)
				}
				b.ReportMetric(float64(kc*lanes*b.N)/b.Elapsed().Seconds()/1e9, "Gelem/s")
			})
		}
	}
}

// BenchmarkMicro times the micro-kernels alone on packed operands that sit
// in the caches: one mc×kc A block against one kc×nr B micro-panel.
func BenchmarkMicro(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 3))
	for _, kern := range kernels {
		kc, mc := kern.kc, kern.mc
		a := randSlice(rng, kc*mc)
		bp := randSlice(rng, kc*kern.nr)
		c := make([]float32, mc*kern.nr)
		b.Run(kern.name, func(b *testing.B) {
			for b.Loop() {
				for ir := 0; ir < mc; ir += kern.mr {
					kern.micro(kc, a[ir*kc:], bp, c[ir*kern.nr:], kern.nr, 1, 1, kern.mr, kern.nr)
				}
			}
			b.ReportMetric(2*float64(mc*kern.nr*kc)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
