package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/titan-go/titan/internal/backend/cpu/workpool"
	"github.com/titan-go/titan/internal/numeric"
)

// withBF16Kernel runs f once for every GemmBF16 kernel this machine
// supports: the AVX512_BF16 one where the CPU has it, and the fallbacks.
func withBF16Kernel(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	saved := BF16Kernel()
	defer func() {
		if err := SetBF16Kernel(saved); err != nil {
			t.Fatal(err)
		}
	}()
	for _, name := range BF16Kernels() {
		if err := SetBF16Kernel(name); err != nil {
			t.Fatal(err)
		}
		t.Run(name, f)
	}
}

// roundedBF16 returns x rounded to bfloat16 as GemmBF16 multiplies it
// (subnormals read as zero), as float32, and as bfloat16 bits.
func roundedBF16(x []float32) ([]float32, []uint16) {
	r := make([]float32, len(x))
	h := make([]uint16, len(x))
	for i, v := range x {
		h[i] = numeric.Float32ToBF16DAZ(v)
		r[i] = numeric.BF16ToFloat32(numeric.BF16DAZ(h[i]))
	}
	return r, h
}

// runBF16 multiplies pr with GemmBF16 on p, passing A and B as float32
// or as bfloat16 by the bits of kinds, and checks C against two float64
// references: with the operands rounded to bfloat16 within float32
// accumulation error, (k+4)·2^-24 relative to Σ|alpha·a·b| + |beta·c|,
// and with the operands as given within the bfloat16 bound: rounding to
// 8 significant bits moves each operand by at most 2^-8 relative, each
// product by 2^-7 + 2^-16.
// It returns the largest error relative to the scale against the
// unrounded operands.
func (pr *problem) runBF16(t *testing.T, p *workpool.Pool, kinds int) float64 {
	t.Helper()
	c0 := append([]float32(nil), pr.c...)
	ar, ah := roundedBF16(pr.a)
	br, bh := roundedBF16(pr.b)
	a, b := F32(pr.a), F32(pr.b)
	if kinds&1 != 0 {
		a = BF16(ah)
	}
	if kinds&2 != 0 {
		b = BF16(bh)
	}
	got := append([]float32(nil), c0...)
	GemmBF16(p, pr.transA, pr.transB, pr.m, pr.n, pr.k, pr.alpha, a, pr.lda, b, pr.ldb, pr.beta, F32(got), pr.ldc)

	rounded := *pr
	rounded.a, rounded.b = ar, br
	want, scale := rounded.reference(c0)
	accTol := float64(pr.k+4) * 0x1p-24
	rounded.checkTol(t, got, want, scale, accTol)

	want, scale = pr.reference(c0)
	pr.checkTol(t, got, want, scale, 0x1p-7+0x1p-16+accTol)
	worst := 0.0
	for idx, w := range want {
		if idx%pr.ldc < pr.n && scale[idx] > 0 {
			worst = max(worst, math.Abs(float64(got[idx])-w)/scale[idx])
		}
	}
	return worst
}

var operandKinds = []string{"f32·f32", "bf16·f32", "f32·bf16", "bf16·bf16"}

func TestGemmBF16Shapes(t *testing.T) {
	shapes := []struct{ m, n, k int }{
		{1, 1, 1}, {1, 1, 0}, {3, 5, 0}, {1, 3, 17}, {3, 1, 17}, {3, 17, 1}, {2, 2, 2},
		{17, 33, 3}, {33, 17, 100}, {100, 33, 17}, {14, 32, 64}, {28, 64, 5},
		{15, 33, 257}, {29, 65, 300}, {1, 100, 257}, {257, 1, 33}, {6, 16, 8},
		{7, 17, 9}, {64, 64, 64}, {100, 100, 100}, {257, 33, 257}, {2, 257, 600},
		{40, 70, 1025}, {9, 31, 31}, {16, 48, 33},
	}
	withBF16Kernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(5, 6))
		for si, s := range shapes {
			for tr := 0; tr < 4; tr++ {
				sc := scalars[(si*4+tr)%len(scalars)]
				pad := (si + tr) % 3 * 3
				// Each shape meets every operand kind over its four
				// transposes.
				pr := newProblem(rng, tr&1 != 0, tr&2 != 0, s.m, s.n, s.k, pad, sc.alpha, sc.beta)
				pr.runBF16(t, nil, (si+tr)%len(operandKinds))
			}
		}
	})
}

// TestGemmBF16Rounds: the products really are of bfloat16 values: on
// random operands the error against the unrounded product is far above
// float32's, for every kernel and operand kind.
func TestGemmBF16Rounds(t *testing.T) {
	withBF16Kernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(7, 8))
		for kinds, kind := range operandKinds {
			pr := newProblem(rng, false, true, 30, 40, 64, 0, 1, 0)
			if worst := pr.runBF16(t, nil, kinds); worst < 0x1p-14 {
				t.Errorf("%s: largest error %g relative to Σ|a||b|: the operands were not rounded to bfloat16", kind, worst)
			}
		}
	})
}

// TestGemmBF16Threads: multiplications big enough to be split run on
// all workers of a pool, for the shapes of a linear layer's forward (NT)
// and backward (NN, TN with accumulation).
func TestGemmBF16Threads(t *testing.T) {
	p := workpool.New(3)
	defer p.Close()
	withBF16Kernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(9, 10))
		for i, c := range []struct {
			transA, transB bool
			m, n, k        int
			beta           float32
		}{
			{false, true, 256, 200, 96, 0},
			{false, false, 256, 96, 200, 1},
			{true, false, 200, 96, 256, 1},
			{false, true, 70, 700, 600, 0.5},
		} {
			pr := newProblem(rng, c.transA, c.transB, c.m, c.n, c.k, 1, 1, c.beta)
			pr.runBF16(t, p, i%len(operandKinds))
		}
	})
}

// TestGemmBF16Subnormals: a subnormal bfloat16 operand counts as zero on
// every kernel, as VDPBF16PS has it (2^-133 · 2^100 would be 2^-33).
func TestGemmBF16Subnormals(t *testing.T) {
	withBF16Kernel(t, func(t *testing.T) {
		for _, kinds := range []int{0, 3} {
			a := []float32{math.Float32frombits(0x00010000), 1}
			b := []float32{0x1p100, 0x1p-40}
			ah, bh := []uint16{0x0001, 0x3f80}, []uint16{numeric.Float32ToBF16(0x1p100), numeric.Float32ToBF16(0x1p-40)}
			A, B := F32(a), F32(b)
			if kinds == 3 {
				A, B = BF16(ah), BF16(bh)
			}
			c := []float32{0}
			GemmBF16(nil, false, false, 1, 1, 2, 1, A, 2, B, 1, 0, F32(c), 1)
			if c[0] != 0x1p-40 {
				t.Errorf("%s: 2^-133·2^100 + 1·2^-40 = %g, want %g (the subnormal read as zero)", operandKinds[kinds], c[0], 0x1p-40)
			}
		}
	})
}

func TestBF16KernelChoice(t *testing.T) {
	names := BF16Kernels()
	if hasBF16 && names[0] != "avx512bf16" {
		t.Errorf("CPU has AVX512_BF16 but the kernels are %v", names)
	}
	if !hasBF16 && names[0] == "avx512bf16" {
		t.Errorf("CPU lacks AVX512_BF16 but the kernels are %v", names)
	}
	if got := len(names); got != len(Kernels())+map[bool]int{true: 1}[hasBF16] {
		t.Errorf("bf16 kernels %v for float32 kernels %v", names, Kernels())
	}
	if err := SetBF16Kernel("nope"); err == nil {
		t.Error("SetBF16Kernel accepted an unknown kernel")
	}
}

// TestGemmBF16Panics: bad arguments are refused as by Sgemm.
func TestGemmBF16Panics(t *testing.T) {
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"short A", func() {
			GemmBF16(nil, false, false, 2, 2, 2, 1, BF16(make([]uint16, 3)), 2, F32(make([]float32, 4)), 2, 0, F32(make([]float32, 4)), 2)
		}},
		{"small ldb", func() {
			GemmBF16(nil, false, false, 2, 2, 2, 1, F32(make([]float32, 4)), 2, F32(make([]float32, 4)), 1, 0, F32(make([]float32, 4)), 2)
		}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", c.name)
				}
			}()
			c.f()
		}()
	}
}

func ExampleGemmBF16() {
	// out = x·Wᵀ for 2 tokens of width 3 and a 2×3 weight in bfloat16.
	x := []float32{1, 2, 3, 4, 5, 6}
	w := []uint16{0x3f80, 0, 0, 0, 0, 0x4000} // rows (1, 0, 0) and (0, 0, 2)
	out := make([]float32, 4)
	GemmBF16(nil, false, true, 2, 2, 3, 1, F32(x), 3, BF16(w), 3, 0, F32(out), 2)
	fmt.Println(out)
	// Output: [1 6 4 12]
}

// TestGemmBF16FallbackAgrees forces each fallback kernel (the float32
// kernels on rounded operands, what a CPU without AVX512_BF16 runs) and
// compares it with the default kernel on the same problems: they multiply
// the same bfloat16 values, so they differ only by float32 accumulation
// order, within 2·(k+4)·2^-24 of Σ|a·b| + |beta·c|.
func TestGemmBF16FallbackAgrees(t *testing.T) {
	saved := BF16Kernel()
	defer SetBF16Kernel(saved)
	p := workpool.New(2)
	defer p.Close()
	rng := rand.New(rand.NewPCG(11, 12))
	for i, s := range []struct {
		transA, transB bool
		m, n, k        int
	}{{false, true, 64, 96, 333}, {false, false, 77, 45, 128}, {true, false, 150, 130, 200}} {
		pr := newProblem(rng, s.transA, s.transB, s.m, s.n, s.k, 0, 1, 1)
		_, ah := roundedBF16(pr.a)
		run := func(name string) []float32 {
			if err := SetBF16Kernel(name); err != nil {
				t.Fatal(err)
			}
			c := append([]float32(nil), pr.c...)
			GemmBF16(p, pr.transA, pr.transB, pr.m, pr.n, pr.k, 1, BF16(ah), pr.lda, F32(pr.b), pr.ldb, 1, F32(c), pr.ldc)
			return c
		}
		def := run(BF16Kernels()[0])
		ar, _ := roundedBF16(pr.a)
		br, _ := roundedBF16(pr.b)
		rounded := *pr
		rounded.a, rounded.b = ar, br
		_, scale := rounded.reference(pr.c)
		for _, name := range BF16Kernels()[1:] {
			got := run(name)
			for idx := range got {
				if d := math.Abs(float64(got[idx]) - float64(def[idx])); d > 2*float64(pr.k+4)*0x1p-24*scale[idx] {
					t.Fatalf("problem %d: kernel %s C[%d] = %g, %s %g", i, name, idx, got[idx], BF16Kernels()[0], def[idx])
				}
			}
		}
	}
}

// TestBF16PeakRatio: MFU's bfloat16 peak is twice float32's with the
// AVX512_BF16 kernel (a pair of products per lane and instruction) and
// float32's with every fallback.
func TestBF16PeakRatio(t *testing.T) {
	saved := BF16Kernel()
	defer SetBF16Kernel(saved)
	for _, name := range BF16Kernels() {
		if err := SetBF16Kernel(name); err != nil {
			t.Fatal(err)
		}
		want := 1.0
		if name == "avx512bf16" {
			want = 2
		}
		if got := BF16PeakRatio(); got != want {
			t.Errorf("kernel %s: peak ratio %g, want %g", name, got, want)
		}
	}
}

// TestGemmBF16IntoBF16: a bfloat16 C holds exactly the nearest-even
// rounding of GemmBF16's float32 C (started from the widened bfloat16 C
// when beta != 0), on every kernel and operand kind, on 1 to 3 workers:
// shapes at and around the micro-tile, cache-block and K-step edges,
// items narrowed to the tile bound, several N blocks, beta 0 (C's NaNs
// ignored), 1 and 0.5, and the k = 0 and alpha = 0 scalings. Elements
// between the rows (ldc padding) keep their bits.
func TestGemmBF16IntoBF16(t *testing.T) {
	pools := []*workpool.Pool{nil, workpool.New(2), workpool.New(3)}
	defer pools[1].Close()
	defer pools[2].Close()
	shapes := []struct{ m, n, k int }{
		{1, 1, 1}, {3, 5, 0}, {13, 31, 511}, {14, 32, 512}, {15, 33, 513}, {29, 65, 1025},
		{337, 40, 300}, {40, 700, 257}, {300, 500, 96}, {20, 8000, 1100}, {2, 3, 1500},
	}
	withBF16Kernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(15, 16))
		for si, s := range shapes {
			for tr := 0; tr < 4; tr++ {
				sc := []struct{ alpha, beta float32 }{{1, 0}, {-0.75, 1}, {1, 0.5}, {0, 0.5}}[(si+tr)%4]
				pr := newProblem(rng, tr&1 != 0, tr&2 != 0, s.m, s.n, s.k, (si+tr)%2*3, sc.alpha, sc.beta)
				_, ah := roundedBF16(pr.a)
				_, bh := roundedBF16(pr.b)
				a, b := F32(pr.a), F32(pr.b)
				kinds := (si + tr) % len(operandKinds)
				if kinds&1 != 0 {
					a = BF16(ah)
				}
				if kinds&2 != 0 {
					b = BF16(bh)
				}
				c0 := make([]uint16, len(pr.c))
				numeric.Float32sToBF16(c0, pr.c) // NaNs with beta 0
				c32 := make([]float32, len(c0))
				numeric.BF16sToFloat32(c32, c0)
				GemmBF16(nil, pr.transA, pr.transB, s.m, s.n, s.k, pr.alpha, a, pr.lda, b, pr.ldb, pr.beta, F32(c32), pr.ldc)
				for workers, p := range pools {
					got := slices.Clone(c0)
					GemmBF16(p, pr.transA, pr.transB, s.m, s.n, s.k, pr.alpha, a, pr.lda, b, pr.ldb, pr.beta, BF16(got), pr.ldc)
					for i, h := range got {
						want := c0[i]
						if i%pr.ldc < s.n {
							want = numeric.Float32ToBF16(c32[i])
						}
						if h != want {
							t.Fatalf("%v on %d workers: C[%d] = %#04x, want %#04x (float32 C %v)", pr, workers+1, i, h, want, c32[i])
						}
					}
				}
			}
		}
	})
}

// TestBF16TileBound: the float32 tiles of a bfloat16 C stay within
// tileFloats per worker (a single panel wider than that apart), however
// wide the N block, and the float32 C's plans have none.
func TestBF16TileBound(t *testing.T) {
	kern := bf16Kernels[0]
	for _, s := range []struct{ threads, m, n, k int }{
		{1, 2048, 2048, 256}, {2, 2048, 16384, 256}, {3, 20, 8000, 1100}, {2, 5000, 64, 64}, {1, 4, 100000, 8},
	} {
		ch := make([]uint16, 1)
		pl := newPlan(kern, s.threads, false, true, s.m, s.n, s.k, 1, nil, nil, s.k, nil, nil, s.k, 0, nil, ch, s.n)
		mb := (s.m + kern.mr - 1) / kern.mr
		rows := (mb + pl.rowBlocks - 1) / pl.rowBlocks * kern.mr
		panels := ((pl.nc+kern.nr-1)/kern.nr + pl.colGroups - 1) / pl.colGroups
		if len(pl.ctile) != pl.nt || rows*panels*kern.nr > max(tileFloats, rows*kern.nr) {
			t.Errorf("%+v: %d tiles for %d workers of %d rows × %d panels of %d (bound %d floats)", s, len(pl.ctile), pl.nt, rows, panels, kern.nr, tileFloats)
		}
		pl.release()
		pl = newPlan(kern, s.threads, false, true, s.m, s.n, s.k, 1, nil, nil, s.k, nil, nil, s.k, 0, nil, nil, s.n)
		if len(pl.ctile) != 0 {
			t.Errorf("%+v: float32 C with %d tiles", s, len(pl.ctile))
		}
		pl.release()
	}
}
