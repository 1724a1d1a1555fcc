package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/backend/cpu/workpool"
)

// relTol bounds the error of each element of C relative to
// |alpha|·Σ|a||b| + |beta|·|c|, the scale of the rounding errors.
const relTol = 1e-5

// withKernel runs f once for every kernel this machine supports.
func withKernel(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	saved := Kernel()
	defer func() {
		if err := SetKernel(saved); err != nil {
			t.Fatal(err)
		}
	}()
	for _, name := range Kernels() {
		if err := SetKernel(name); err != nil {
			t.Fatal(err)
		}
		t.Run(name, f)
	}
}

// problem is one multiplication with its operands laid out in memory.
type problem struct {
	transA, transB bool
	m, n, k        int
	alpha, beta    float32
	lda, ldb, ldc  int
	a, b, c        []float32
}

// newProblem builds random operands; pad is added to every minimal
// leading dimension. With beta == 0, C starts out as NaN.
func newProblem(rng *rand.Rand, transA, transB bool, m, n, k, pad int, alpha, beta float32) *problem {
	pr := &problem{transA: transA, transB: transB, m: m, n: n, k: k, alpha: alpha, beta: beta}
	rowsA, colsA := m, k
	if transA {
		rowsA, colsA = k, m
	}
	rowsB, colsB := k, n
	if transB {
		rowsB, colsB = n, k
	}
	pr.lda = max(1, colsA) + pad
	pr.ldb = max(1, colsB) + pad
	pr.ldc = max(1, n) + pad
	// Exact spans: the last row ends at its last element, so that reads
	// past a matrix fail the bounds checks.
	pr.a = randSlice(rng, span(rowsA, colsA, pr.lda))
	pr.b = randSlice(rng, span(rowsB, colsB, pr.ldb))
	pr.c = randSlice(rng, span(m, n, pr.ldc))
	if beta == 0 {
		for i := range pr.c {
			pr.c[i] = float32(math.NaN())
		}
	}
	return pr
}

// span is the number of elements a rows×cols matrix with leading
// dimension ld occupies.
func span(rows, cols, ld int) int {
	if rows == 0 || cols == 0 {
		return 0
	}
	return (rows-1)*ld + cols
}

func randSlice(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.NormFloat64())
	}
	return s
}

func (pr *problem) String() string {
	return fmt.Sprintf("tA=%v tB=%v m=%d n=%d k=%d alpha=%g beta=%g lda=%d ldb=%d ldc=%d",
		pr.transA, pr.transB, pr.m, pr.n, pr.k, pr.alpha, pr.beta, pr.lda, pr.ldb, pr.ldc)
}

// reference computes the expected C in float64, with the error scale of
// each element, from the operands and the original C c0.
func (pr *problem) reference(c0 []float32) (want, scale []float64) {
	want = make([]float64, len(c0))
	scale = make([]float64, len(c0))
	for i := range c0 {
		want[i] = float64(c0[i])
	}
	at := func(i, l int) float64 {
		if pr.transA {
			return float64(pr.a[l*pr.lda+i])
		}
		return float64(pr.a[i*pr.lda+l])
	}
	bt := func(l, j int) float64 {
		if pr.transB {
			return float64(pr.b[j*pr.ldb+l])
		}
		return float64(pr.b[l*pr.ldb+j])
	}
	alpha, beta := float64(pr.alpha), float64(pr.beta)
	for i := 0; i < pr.m; i++ {
		for j := 0; j < pr.n; j++ {
			var s, abs float64
			for l := 0; l < pr.k; l++ {
				x := at(i, l) * bt(l, j)
				s += x
				abs += math.Abs(x)
			}
			idx := i*pr.ldc + j
			old := 0.0
			if beta != 0 {
				old = beta * want[idx]
			}
			want[idx] = alpha*s + old
			scale[idx] = math.Abs(alpha)*abs + math.Abs(old)
		}
	}
	return want, scale
}

// check compares got with the reference, including the padding of C,
// which must be untouched.
func (pr *problem) check(t *testing.T, got []float32, want, scale []float64) {
	t.Helper()
	pr.checkTol(t, got, want, scale, relTol)
}

// checkTol is check with the tolerance relTol relative to the scale.
func (pr *problem) checkTol(t *testing.T, got []float32, want, scale []float64, relTol float64) {
	t.Helper()
	bad := 0
	for idx, w := range want {
		g := float64(got[idx])
		i, j := idx/pr.ldc, idx%pr.ldc
		var ok bool
		if j >= pr.n {
			ok = math.Float32bits(got[idx]) == math.Float32bits(float32(w)) || (math.IsNaN(g) && math.IsNaN(w))
		} else {
			ok = math.Abs(g-w) <= relTol*scale[idx]+1e-30
		}
		if !ok {
			if bad < 5 {
				t.Errorf("%v: C[%d][%d] = %g, want %g (scale %g)", pr, i, j, g, w, scale[idx])
			}
			bad++
		}
	}
	if bad > 5 {
		t.Errorf("%v: %d wrong elements in all", pr, bad)
	}
}

// run multiplies with Sgemm on p and checks the result.
func (pr *problem) run(t *testing.T, p *workpool.Pool) {
	t.Helper()
	c0 := append([]float32(nil), pr.c...)
	want, scale := pr.reference(c0)
	got := append([]float32(nil), c0...)
	Sgemm(p, pr.transA, pr.transB, pr.m, pr.n, pr.k, pr.alpha, pr.a, pr.lda, pr.b, pr.ldb, pr.beta, got, pr.ldc)
	pr.check(t, got, want, scale)
}

var scalars = []struct{ alpha, beta float32 }{
	{1, 0}, {0.5, 1}, {-1, 0.5}, {1, -1}, {1, 1}, {0.5, 0}, {-1, -1}, {0, 0.5}, {0, 0},
}

func TestSgemmShapes(t *testing.T) {
	shapes := []struct{ m, n, k int }{
		{1, 1, 1}, {1, 1, 0}, {3, 5, 0}, {1, 3, 17}, {3, 1, 17}, {3, 17, 1},
		{17, 33, 3}, {33, 17, 100}, {100, 33, 17}, {14, 32, 64}, {28, 64, 5},
		{15, 33, 257}, {29, 65, 300}, {1, 100, 257}, {257, 1, 33}, {6, 16, 8},
		{7, 17, 9}, {64, 64, 64}, {100, 100, 100}, {257, 33, 257}, {2, 257, 600},
	}
	withKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		for si, s := range shapes {
			for tr := 0; tr < 4; tr++ {
				sc := scalars[(si*4+tr)%len(scalars)]
				pad := (si + tr) % 3 * 3
				pr := newProblem(rng, tr&1 != 0, tr&2 != 0, s.m, s.n, s.k, pad, sc.alpha, sc.beta)
				pr.run(t, nil)
			}
		}
	})
}

func TestSgemmScalars(t *testing.T) {
	withKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(3, 4))
		for _, sc := range scalars {
			for tr := 0; tr < 4; tr++ {
				pr := newProblem(rng, tr&1 != 0, tr&2 != 0, 19, 37, 23, 2, sc.alpha, sc.beta)
				pr.run(t, nil)
			}
		}
	})
}

// TestSgemmBlocking crosses the K, M and N block edges of every kernel
// and uses several workers.
func TestSgemmBlocking(t *testing.T) {
	shapes := []struct{ m, n, k int }{
		{300, 200, 150},  // parallel, split over rows
		{700, 40, 20},    // m past mc
		{20, 700, 300},   // few rows: split over columns
		{5, 2100, 2100},  // k×n past packedBFloats: several N blocks
		{2100, 5, 2050},  // m×k past packedAFloats: A packed per item
		{40, 40, 1100},   // several K blocks
		{129, 257, 520},  // all edges at once
		{2048, 30, 1},    // k = 1 with many rows
		{1, 2000, 2000},  // a single row
		{2000, 1, 2000},  // a single column
		{200, 77, 1000},  // balanced K blocks
		{101, 1030, 129}, // panels not a multiple of the workers
	}
	pools := []*workpool.Pool{nil, workpool.New(1), workpool.New(2), workpool.New(3)}
	defer func() {
		for _, p := range pools[1:] {
			p.Close()
		}
	}()
	withKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(5, 6))
		for si, s := range shapes {
			for tr := 0; tr < 4; tr++ {
				sc := scalars[(si+tr)%len(scalars)]
				if sc.alpha == 0 {
					sc.alpha = 1
				}
				pr := newProblem(rng, tr&1 != 0, tr&2 != 0, s.m, s.n, s.k, tr, sc.alpha, sc.beta)
				pr.run(t, pools[(si+tr)%len(pools)])
			}
		}
	})
}

func TestSgemmStridedBatched(t *testing.T) {
	p := workpool.New(2)
	defer p.Close()
	cases := []struct {
		transA, transB bool
		m, n, k, batch int
		shareA         bool
		pool           *workpool.Pool
	}{
		{false, true, 64, 64, 64, 6, false, p},
		{false, false, 100, 64, 200, 3, false, p},
		{true, false, 33, 17, 9, 5, true, p},
		{true, true, 17, 20, 30, 4, false, nil},
		{false, true, 300, 300, 64, 3, false, p}, // large: parallel inside
		{false, false, 5, 5, 5, 1, false, p},
		{false, false, 5, 5, 5, 0, false, p},
		{false, true, 5, 6, 0, 3, false, p}, // k = 0: A and B are empty
	}
	withKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(7, 8))
		for ci, tc := range cases {
			sc := scalars[ci%len(scalars)]
			var probs []*problem
			for i := 0; i < tc.batch; i++ {
				probs = append(probs, newProblem(rng, tc.transA, tc.transB, tc.m, tc.n, tc.k, 1, sc.alpha, sc.beta))
			}
			if tc.batch == 0 {
				SgemmStridedBatched(tc.pool, tc.transA, tc.transB, tc.m, tc.n, tc.k, 1, nil, 6, 0, nil, 6, 0, 0, nil, 6, 0, 0)
				continue
			}
			if tc.shareA {
				for _, pr := range probs {
					pr.a = probs[0].a
				}
			}
			pr0 := probs[0]
			strideA, strideB, strideC := len(pr0.a)+3, len(pr0.b)+1, len(pr0.c)+2
			if tc.shareA {
				strideA = 0
			}
			a := make([]float32, (tc.batch-1)*strideA+len(pr0.a))
			b := make([]float32, tc.batch*strideB)
			c := make([]float32, tc.batch*strideC)
			var wants, scales [][]float64
			for i, pr := range probs {
				copy(a[i*strideA:], pr.a)
				copy(b[i*strideB:], pr.b)
				copy(c[i*strideC:], pr.c)
				w, s := pr.reference(pr.c)
				wants, scales = append(wants, w), append(scales, s)
			}
			if tc.k == 0 {
				a, b = nil, nil
			}
			SgemmStridedBatched(tc.pool, tc.transA, tc.transB, tc.m, tc.n, tc.k, sc.alpha, a, pr0.lda, strideA,
				b, pr0.ldb, strideB, sc.beta, c, pr0.ldc, strideC, tc.batch)
			for i, pr := range probs {
				pr.check(t, c[i*strideC:i*strideC+len(pr.c)], wants[i], scales[i])
				for j := i*strideC + len(pr.c); j < (i+1)*strideC; j++ {
					if c[j] != 0 {
						t.Errorf("case %d: gap element %d after matrix %d written: %g", ci, j, i, c[j])
					}
				}
			}
		}
	})
}

// TestPack checks the packing routines of every kernel against their
// definitions, including the zero padding.
func TestPack(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, kern := range kernels {
		for _, lanes := range []int{kern.mr, kern.nr, 1, 14, 16, 17, 32} {
			for _, kc := range []int{1, 5, 16, 17, 33, 256} {
				// transPack: one panel of rows <= lanes rows.
				for _, rows := range []int{1, lanes / 2, lanes - 1, lanes} {
					if rows < 1 {
						continue
					}
					ld := kc + 3
					src := randSlice(rng, rows*ld)
					dst := nanSlice(kc*lanes + 1)
					kern.transPack(dst, src, ld, rows, lanes, kc)
					checkPanels(t, kern.name+" transPack", dst, lanes, kc, rows, func(p, r int) float32 { return src[r*ld+p] })
				}
				// copyPack: several panels.
				for _, cols := range []int{1, lanes - 1, lanes, 2*lanes + 1, 3 * lanes} {
					if cols < 1 {
						continue
					}
					ld := cols + 2
					src := randSlice(rng, kc*ld)
					panels := (cols + lanes - 1) / lanes
					dst := nanSlice(panels*kc*lanes + 1)
					kern.copyPack(dst, src, ld, lanes, kc, cols)
					checkPanels(t, kern.name+" copyPack", dst, lanes, kc, cols, func(p, r int) float32 { return src[p*ld+r] })
				}
			}
		}
	}
}

func nanSlice(n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(math.NaN())
	}
	return s
}

// checkPanels checks that dst holds the kc×lanes panels of the cols
// columns of at(p, col), zero padded, followed by one untouched NaN.
func checkPanels(t *testing.T, what string, dst []float32, lanes, kc, cols int, at func(p, col int) float32) {
	t.Helper()
	panels := (cols + lanes - 1) / lanes
	bad := 0
	for q := 0; q < panels; q++ {
		for p := 0; p < kc; p++ {
			for r := 0; r < lanes; r++ {
				var want float32
				if col := q*lanes + r; col < cols {
					want = at(p, col)
				}
				if got := dst[(q*kc+p)*lanes+r]; got != want {
					if bad < 3 {
						t.Errorf("%s lanes=%d kc=%d cols=%d: panel %d [%d][%d] = %g, want %g", what, lanes, kc, cols, q, p, r, got, want)
					}
					bad++
				}
			}
		}
	}
	if !math.IsNaN(float64(dst[panels*kc*lanes])) {
		t.Errorf("%s lanes=%d kc=%d cols=%d: wrote past the panels", what, lanes, kc, cols)
	}
}

func TestSgemmNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	p := workpool.New(2)
	defer p.Close()
	rng := rand.New(rand.NewPCG(11, 12))
	pr := newProblem(rng, false, true, 200, 300, 100, 0, 1, 0)
	bpr := newProblem(rng, false, true, 32, 32, 16, 0, 1, 0)
	run := func() {
		Sgemm(p, pr.transA, pr.transB, pr.m, pr.n, pr.k, 1, pr.a, pr.lda, pr.b, pr.ldb, 0, pr.c, pr.ldc)
		Sgemm(p, false, false, 5, 6, 7, 1, pr.a, 7, pr.b, 6, 1, pr.c, 6)
		SgemmStridedBatched(p, false, true, 8, 8, 8, 1, bpr.a, 8, 64, bpr.b, 8, 64, 0, bpr.c, 8, 64, 8)
	}
	run()
	if allocs := testing.AllocsPerRun(20, run); allocs >= 1 {
		t.Errorf("steady-state calls allocate %.1f times", allocs)
	}
}

func TestSetKernel(t *testing.T) {
	names := Kernels()
	if len(names) == 0 || names[len(names)-1] != "generic" {
		t.Fatalf("Kernels() = %v, want a list ending in generic", names)
	}
	if Kernel() != names[0] {
		t.Errorf("default kernel %q, want the fastest, %q", Kernel(), names[0])
	}
	if err := SetKernel("nonesuch"); err == nil || !strings.Contains(err.Error(), "nonesuch") {
		t.Errorf("SetKernel(nonesuch) = %v, want an error naming it", err)
	}
	if Kernel() != names[0] {
		t.Errorf("failed SetKernel changed the kernel to %q", Kernel())
	}
}

func TestSgemmPanics(t *testing.T) {
	a := make([]float32, 12)
	cases := []struct {
		name string
		f    func()
		want string
	}{
		{"negative m", func() { Sgemm(nil, false, false, -1, 2, 2, 1, a, 2, a, 2, 0, a, 2) }, "negative dimension"},
		{"small lda", func() { Sgemm(nil, false, false, 2, 2, 3, 1, a, 2, a, 2, 0, a, 2) }, "lda=2"},
		{"small ldb transB", func() { Sgemm(nil, false, true, 2, 2, 3, 1, a, 3, a, 2, 0, a, 2) }, "ldb=2"},
		{"short a", func() { Sgemm(nil, true, false, 4, 2, 4, 1, a, 4, a, 2, 0, a, 2) }, "len(a)=12"},
		{"short c", func() { Sgemm(nil, false, false, 2, 6, 2, 1, a, 2, a, 6, 0, a, 7) }, "len(c)=12"},
		{"overlapping C", func() {
			SgemmStridedBatched(nil, false, false, 2, 2, 2, 1, a, 2, 0, a, 2, 0, 0, a, 2, 3, 2)
		}, "strideC=3"},
		{"negative stride", func() {
			SgemmStridedBatched(nil, false, false, 2, 2, 2, 1, a, 2, -1, a, 2, 0, 0, a, 2, 4, 2)
		}, "strideA=-1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(fmt.Sprint(r), tc.want) {
					t.Errorf("panic %v, want one mentioning %q", r, tc.want)
				}
			}()
			tc.f()
		})
	}
}

// TestPlanSplit checks the blocking and work split of a few shapes, so
// that the tests above do cover several N blocks, column groups and the
// single-threaded path.
func TestPlanSplit(t *testing.T) {
	kern := kernels[0]
	cases := []struct {
		threads, m, n, k int
		check            func(pl *plan) bool
		want             string
	}{
		{2, 5, 2100, 2100, func(pl *plan) bool { return pl.nc < pl.n && pl.nt == 2 && pl.apk != nil }, "several N blocks on 2 workers, A packed whole"},
		{2, 2100, 5, 2050, func(pl *plan) bool { return pl.apk == nil && len(pl.abuf) == 2 }, "A packed per item"},
		{2, 20, 700, 300, func(pl *plan) bool { return pl.colGroups > 1 && pl.apk != nil }, "column groups for few rows, A packed whole"},
		{2, 2048, 768, 768, func(pl *plan) bool { return pl.rowBlocks*pl.colGroups%2 == 0 && pl.colGroups == 1 && pl.apk == nil }, "an even number of row items, A packed per item"},
		{2, 16, 16, 16, func(pl *plan) bool { return pl.nt == 1 }, "one worker for a tiny product"},
		{1, 2048, 768, 768, func(pl *plan) bool { return pl.nt == 1 && pl.colGroups == 1 }, "one worker when there is one thread"},
		{2, 300, 300, 1000, func(pl *plan) bool { return pl.kc*((pl.k+pl.kc-1)/pl.kc) >= pl.k && pl.kc <= kern.kc }, "balanced K steps"},
	}
	for _, tc := range cases {
		pl := newPlan(kern, tc.threads, false, false, tc.m, tc.n, tc.k, 1, nil, nil, tc.k, nil, nil, tc.n, 0, nil, nil, tc.n)
		if !tc.check(pl) {
			t.Errorf("%s m=%d n=%d k=%d threads=%d: got nt=%d kc=%d nc=%d rowBlocks=%d colGroups=%d, want %s",
				kern.name, tc.m, tc.n, tc.k, tc.threads, pl.nt, pl.kc, pl.nc, pl.rowBlocks, pl.colGroups, tc.want)
		}
		pl.release()
	}
}

// TestSleepingWaiters: with every wait on a work counter sleeping (no
// spinning), multiplications split over more workers than cores give
// the bits of a single-threaded run, for float32 and bf16, across the
// blockings of TestSgemmBlocking.
func TestSleepingWaiters(t *testing.T) {
	defer func(n int) { waitSpins = n }(waitSpins)
	waitSpins = 0
	p := workpool.New(5)
	defer p.Close()
	rng := rand.New(rand.NewPCG(13, 14))
	for _, s := range []struct{ m, n, k int }{
		{300, 200, 150}, {5, 2100, 2100}, {2100, 5, 2050}, {20, 700, 300}, {129, 257, 520},
	} {
		for tr := 0; tr < 4; tr++ {
			pr := newProblem(rng, tr&1 != 0, tr&2 != 0, s.m, s.n, s.k, tr, 1, 0.5)
			for _, bf16 := range []bool{false, true} {
				one, many := slices.Clone(pr.c), slices.Clone(pr.c)
				for _, run := range []struct {
					pool *workpool.Pool
					c    []float32
				}{{nil, one}, {p, many}} {
					pool, c := run.pool, run.c
					if bf16 {
						GemmBF16(pool, pr.transA, pr.transB, s.m, s.n, s.k, 1, F32(pr.a), pr.lda, F32(pr.b), pr.ldb, 0.5, F32(c), pr.ldc)
					} else {
						Sgemm(pool, pr.transA, pr.transB, s.m, s.n, s.k, 1, pr.a, pr.lda, pr.b, pr.ldb, 0.5, c, pr.ldc)
					}
				}
				for i := range one {
					if math.Float32bits(one[i]) != math.Float32bits(many[i]) {
						t.Fatalf("bf16=%v %dx%dx%d transA=%v transB=%v: element %d is %v on 5 workers, %v on one",
							bf16, s.m, s.n, s.k, pr.transA, pr.transB, i, many[i], one[i])
					}
				}
			}
		}
	}
}
