package llama

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/float8"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/numeric"
	"github.com/titan-go/titan/internal/randstream"
)

// castSpec is a float8 cast of a recipe: to e5m2 (else e4m3), scaled by
// tensor (g 0), by row (1) or by column (2), scales rounded down to
// powers of two with pow2.
type castSpec struct {
	e5m2 bool
	g    int
	pow2 bool
}

// refQuant is the specification of a float8 cast, written out
// independently of package float8: scale = max/amax (float32, amax
// floored at 1e-12, rounded down to a power of two when pow2), value =
// the saturating numeric conversion of x·scale. It returns the float8
// values of rows×cols x (as float32) and each element's scale.
func refQuant(x []float32, rows, cols int, c castSpec) (q, scales []float32) {
	mx, conv := float32(448), func(v float32) float32 { return numeric.E4M3ToFloat32(numeric.Float32ToE4M3Sat(v)) }
	if c.e5m2 {
		mx, conv = 57344, func(v float32) float32 { return numeric.E5M2ToFloat32(numeric.Float32ToE5M2Sat(v)) }
	}
	group := func(i, j int) int {
		switch c.g {
		case 1:
			return i
		case 2:
			return j
		}
		return 0
	}
	amax := map[int]float32{}
	for i := 0; i < rows; i++ {
		for j := 0; j < cols; j++ {
			k := group(i, j)
			amax[k] = max(amax[k], float32(math.Abs(float64(x[i*cols+j]))))
		}
	}
	scale := map[int]float32{}
	for k, a := range amax {
		s := mx / max(a, 1e-12)
		if c.pow2 {
			s = float32(math.Exp2(math.Floor(math.Log2(float64(s)))))
		}
		scale[k] = s
	}
	q, scales = make([]float32, len(x)), make([]float32, len(x))
	for i := 0; i < rows; i++ {
		for j := 0; j < cols; j++ {
			s := scale[group(i, j)]
			q[i*cols+j], scales[i*cols+j] = conv(x[i*cols+j]*s), s
		}
	}
	return q, scales
}

// refCast returns the dequantized values q/scale of refQuant in float64.
func refCast(x []float32, rows, cols int, c castSpec) []float64 {
	q, s := refQuant(x, rows, cols, c)
	out := make([]float64, len(x))
	for i := range out {
		out[i] = float64(q[i]) / float64(s[i])
	}
	return out
}

func refBF16(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(numeric.RoundBF16(v))
	}
	return out
}

func ref32(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

// refMatmul returns C[i,j] = Σ_k A(i,k)·B(k,j) and Σ_k |A(i,k)·B(k,j)|,
// with A and B given as element functions.
func refMatmul(m, n, k int, a, b func(i, j int) float64) (c, abs []float64) {
	c, abs = make([]float64, m*n), make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			for p := 0; p < k; p++ {
				t := a(i, p) * b(p, j)
				c[i*n+j] += t
				abs[i*n+j] += math.Abs(t)
			}
		}
	}
	return c, abs
}

// TestLinearPrecision: a linear layer's three products — y = x·Wᵀ,
// dx = dy·W, dW = dyᵀ·x — in float32, in bfloat16 and in float8 with
// each recipe, against the products of the operands cast as the recipe
// specifies (refCast, refBF16), in float64, within float32 accumulation
// error; the float8 operands each product multiplied are refQuant's
// values bit for bit. The casts of the recipes differ by far more than
// the bound, so a product computed with another recipe's formats,
// granularity or scales fails. A layer filter_fqns names stays in
// bfloat16. Under TP2 a column-parallel (wq) and a row-parallel (wo)
// layer compute the same products from their shards (of the output
// features, of the input features), summed over the ranks where they
// are partial, and multiply their shards of the same float8 values: each
// rank casts with the whole tensor's, row's or column's scales. The
// operands' magnitudes fall along both dimensions, so that a scale from
// one shard's amax is another power of two.
func TestLinearPrecision(t *testing.T) {
	cfg := parallelTestConfig()
	const N, in, out = 24, 40, 32
	r := newTestRand(11)
	x, w, dy := graded(r.vec(N*in, 1), N, in), graded(r.vec(out*in, 0.2), out, in), graded(r.vec(N*out, 1e-3), N, out)
	dx0, dw0 := r.vec(N*in, 1), r.vec(out*in, 1)
	wt, dyt := func(i, j int) int { return i*in + j }, func(i, j int) int { return i*out + j }
	// The operands of the products, in order: y: x, W; dx: dy, W; dW: dy, x.
	type operand struct {
		v          []float32
		rows, cols int
	}
	ops := [6]operand{{x, N, in}, {w, out, in}, {dy, N, out}, {w, out, in}, {dy, N, out}, {x, N, in}}
	tensorwise := [6]*castSpec{{}, {}, {e5m2: true}, {}, {e5m2: true}, {}}
	rowwise := [6]*castSpec{{g: 1, pow2: true}, {g: 1, pow2: true}, {g: 1, pow2: true}, {g: 2, pow2: true}, {g: 2, pow2: true}, {g: 2, pow2: true}}
	gwhp := rowwise
	gwhp[3], gwhp[4], gwhp[5] = &castSpec{pow2: true}, nil, nil
	for _, c := range []struct {
		name string
		prec model.Precision
		// each operand's float8 cast, nil: in high precision, hp
		spec [6]*castSpec
		hp   func([]float32) []float64
	}{
		{"float32", model.Precision{}, [6]*castSpec{}, ref32},
		{"bfloat16", model.Precision{Param: backend.BFloat16}, [6]*castSpec{}, refBF16},
		{"float8 tensorwise", f8prec(float8.Tensorwise, nil), tensorwise, nil},
		{"float8 rowwise", f8prec(float8.Rowwise, nil), rowwise, nil},
		{"float8 rowwise_with_gw_hp", f8prec(float8.RowwiseGWHP, nil), gwhp, refBF16},
		{"float8 filtered", f8prec(float8.Tensorwise, []string{"attention.wq", "attention.wo"}), [6]*castSpec{}, refBF16},
	} {
		var g [6][]float64 // the dequantized operands
		var q [6][]float32 // the float8 values of the float8 ones
		for i, o := range ops {
			if sp := c.spec[i]; sp != nil {
				g[i] = refCast(o.v, o.rows, o.cols, *sp)
				q[i], _ = refQuant(o.v, o.rows, o.cols, *sp)
			} else {
				g[i] = c.hp(o.v)
			}
		}
		wantY, absY := refMatmul(N, out, in, func(i, p int) float64 { return g[0][i*in+p] }, func(p, j int) float64 { return g[1][wt(j, p)] })
		wantDX, absDX := refMatmul(N, in, out, func(i, p int) float64 { return g[2][dyt(i, p)] }, func(p, j int) float64 { return g[3][wt(p, j)] })
		wantDW, absDW := refMatmul(out, in, N, func(i, p int) float64 { return g[4][dyt(p, i)] }, func(p, j int) float64 { return g[5][p*in+j] })
		for _, l := range []struct {
			tp int
			id linID
			// how the tp ranks split x, W, dy (and y, dx, dW alike)
			x, w, dy tpSplitOf
		}{
			{1, linWq, unsplit, unsplit, unsplit},
			{2, linWq, unsplit, splitRows, splitCols},
			{2, linWo, splitCols, splitCols, unsplit},
		} {
			t.Run(fmt.Sprintf("%s tp%d %s", c.name, l.tp, linNames[l.id]), func(t *testing.T) {
				split := [6]tpSplitOf{l.x, l.w, l.dy, l.w, l.dy, l.x}
				Y, DX, DW := make([]float32, N*out), make([]float32, N*in), make([]float32, out*in)
				group := newFakeGroup(l.tp)
				var mu sync.Mutex
				var wg sync.WaitGroup
				for rank := range l.tp {
					wg.Add(1)
					go func() {
						defer wg.Done()
						be := cpu.New(1)
						defer be.Close()
						m, err := New(be, cfg, 1, 8, Plan{TP: l.tp, TPRank: rank, Comm: &fakeComm{tp: group, tpRank: rank}, Precision: c.prec})
						if err != nil {
							t.Error(err)
							return
						}
						up := func(v []float32) backend.Tensor {
							t := be.Alloc(backend.Float32, len(v))
							be.Upload(t, v)
							return t
						}
						lin, lout := in, out // this rank's features
						if l.x == splitCols {
							lin /= l.tp
						}
						if l.dy == splitCols {
							lout /= l.tp
						}
						// multiplied checks that product p multiplied this
						// rank's shards of the float8 values of its operands.
						multiplied := func(p int) {
							for i := 2 * p; i < 2*p+2; i++ {
								if q[i] == nil {
									continue
								}
								want := split[i].shard(q[i], ops[i].rows, ops[i].cols, rank, l.tp)
								got := download(be, m.f8buf[i%2])[:len(want)]
								for j := range want {
									if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
										t.Errorf("rank %d product %d operand %d: float8 value %d is %g, the whole tensor's cast %g", rank, p, i%2, j, got[j], want[j])
										break
									}
								}
							}
						}
						X, W, DY := up(l.x.shard(x, N, in, rank, l.tp)), up(l.w.shard(w, out, in, rank, l.tp)), up(l.dy.shard(dy, N, out, rank, l.tp))
						Yr := up(make([]float32, N*lout))
						DXr, DWr := up(l.x.part(dx0, N, in, rank, l.tp)), up(l.w.part(dw0, out, in, rank, l.tp))
						key := linKey{0, l.id}
						m.linear(key, Yr, X, W, N, lin, lout, false)
						multiplied(0)
						m.linearInputGrad(key, DXr, DY, W, N, lin, lout, 1)
						multiplied(1)
						m.linearWeightGrad(key, DWr, DY, X, N, lin, lout)
						multiplied(2)
						if m.linErr != nil {
							t.Error(m.linErr)
						}
						mu.Lock()
						defer mu.Unlock()
						l.dy.place(Y, download(be, Yr), N, out, rank, l.tp)
						l.x.place(DX, download(be, DXr), N, in, rank, l.tp)
						l.w.place(DW, download(be, DWr), out, in, rank, l.tp)
					}()
				}
				wg.Wait()
				if t.Failed() {
					return
				}
				check := func(what string, got []float32, base []float32, want, abs []float64, k int) {
					t.Helper()
					for i := range got {
						b := 0.0
						if base != nil {
							b = float64(base[i])
						}
						tol := float64(k+8)*0x1p-24*(abs[i]+math.Abs(b)) + 1e-30
						if d := math.Abs(float64(got[i]) - b - want[i]); d > tol {
							t.Fatalf("%s[%d] = %.9g, want %.9g (off by %.3g, bound %.3g)", what, i, float64(got[i])-b, want[i], d, tol)
						}
					}
				}
				check("y", Y, nil, wantY, absY, in)
				check("dx", DX, dx0, wantDX, absDX, out)
				check("dW", DW, dw0, wantDW, absDW, N)
			})
		}
	}
}

// graded scales x [rows, cols] by 2^(-3i/rows - 3j/cols) in place and
// returns it: the second half of each row and of each column is scaled
// by 2^-1.5 or less.
func graded(x []float32, rows, cols int) []float32 {
	for i := range rows {
		for j := range cols {
			x[i*cols+j] *= float32(math.Exp2(-3*float64(i)/float64(rows) - 3*float64(j)/float64(cols)))
		}
	}
	return x
}

// tpSplitOf is how tensor parallelism splits a matrix over the tp ranks:
// not at all (every rank holds all of an input; an output is the sum of
// the ranks' partial ones), or into blocks of rows or of columns.
type tpSplitOf uint8

const (
	unsplit tpSplitOf = iota
	splitRows
	splitCols
)

// shard returns rank's block of full [rows, cols] (all of it when unsplit).
func (s tpSplitOf) shard(full []float32, rows, cols, rank, tp int) []float32 {
	switch s {
	case splitRows:
		n := rows / tp * cols
		return slices.Clone(full[rank*n : (rank+1)*n])
	case splitCols:
		k := cols / tp
		out := make([]float32, 0, rows*k)
		for i := range rows {
			out = append(out, full[i*cols+rank*k:i*cols+(rank+1)*k]...)
		}
		return out
	}
	return slices.Clone(full)
}

// part is rank's share of an output's initial value full: its block, or
// for a partial (unsplit) output all of full on rank 0 and zeros elsewhere,
// so that the ranks' outputs sum to one initial value.
func (s tpSplitOf) part(full []float32, rows, cols, rank, tp int) []float32 {
	if s == unsplit && rank > 0 {
		return make([]float32, len(full))
	}
	return s.shard(full, rows, cols, rank, tp)
}

// place writes rank's block of an output into full [rows, cols], or adds
// its partial output (unsplit) to full.
func (s tpSplitOf) place(full, part []float32, rows, cols, rank, tp int) {
	switch s {
	case splitRows:
		copy(full[rank*rows/tp*cols:], part)
	case splitCols:
		k := cols / tp
		for i := range rows {
			copy(full[i*cols+rank*k:i*cols+(rank+1)*k], part[i*k:(i+1)*k])
		}
	default:
		for i, v := range part {
			full[i] += v
		}
	}
}

func f8prec(r float8.Recipe, filter []string) model.Precision {
	if filter == nil {
		filter = []string{"output"}
	}
	return model.Precision{Param: backend.BFloat16, Float8: &float8.Config{Recipe: r, FilterFQNs: filter}}
}

func download(be backend.Backend, t backend.Tensor) []float32 {
	h := make([]float32, t.Len)
	be.Download(h, t)
	return h
}

// testRand is a small deterministic generator of test vectors.
type testRand struct{ s uint64 }

func newTestRand(seed uint64) *testRand { return &testRand{seed*0x9e3779b97f4a7c15 + 1} }

// vec returns n values uniform in (-scale, scale).
func (r *testRand) vec(n int, scale float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		r.s = randstream.SplitMix64(r.s)
		out[i] = scale * (float32(r.s>>40)/float32(1<<24)*2 - 1)
	}
	return out
}

// TestFloat8OutputFiltered: by default (filter_fqns = ["output"]) the
// output projection stays in high precision, every block linear computes
// in float8; a converted output projection with chunked logits is
// refused, naming filter_fqns.
func TestFloat8OutputFiltered(t *testing.T) {
	cfg := parallelTestConfig()
	m, err := planModel(cfg, 1, 8, Plan{Precision: f8prec(float8.Tensorwise, nil)})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for k, on := range m.f8 {
		if on {
			n++
		}
		if k.id == linOutput && on {
			t.Error("the output projection computes in float8 under the default filter")
		}
	}
	if want := 7 * cfg.NLayers; n != want {
		t.Errorf("%d linear layers in float8, want %d", n, want)
	}
	_, err = planModel(cfg, 1, 8, Plan{LogitChunk: 3, Precision: f8prec(float8.Tensorwise, []string{})})
	if err == nil || !contains(err.Error(), "float8.filter_fqns") {
		t.Errorf("chunked float8 output: error %v, want one naming float8.filter_fqns", err)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
