package llama

import (
	"math"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/float8"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/numeric"
)

// refCast is the specification of a float8 cast, written out
// independently of package float8: scale = max/amax (float32, amax
// floored at 1e-12, rounded down to a power of two when pow2), value =
// the saturating numeric conversion of x·scale. rows×cols x is scaled by
// tensor (g 0), by row (1) or by column (2); it returns the dequantized
// values q/scale in float64.
func refCast(x []float32, rows, cols int, e5m2 bool, g int, pow2 bool) []float64 {
	mx, conv := float32(448), func(v float32) float32 { return numeric.E4M3ToFloat32(numeric.Float32ToE4M3Sat(v)) }
	if e5m2 {
		mx, conv = 57344, func(v float32) float32 { return numeric.E5M2ToFloat32(numeric.Float32ToE5M2Sat(v)) }
	}
	group := func(i, j int) int {
		switch g {
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
		if pow2 {
			s = float32(math.Exp2(math.Floor(math.Log2(float64(s)))))
		}
		scale[k] = s
	}
	out := make([]float64, len(x))
	for i := 0; i < rows; i++ {
		for j := 0; j < cols; j++ {
			s := scale[group(i, j)]
			out[i*cols+j] = float64(conv(x[i*cols+j]*s)) / float64(s)
		}
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
// error. The casts of the recipes differ by far more than that bound, so
// a product computed with another recipe's formats, granularity or
// scales fails. A layer filter_fqns names stays in bfloat16.
func TestLinearPrecision(t *testing.T) {
	cfg := parallelTestConfig()
	const N, in, out = 24, 40, 32
	r := newTestRand(11)
	x, w, dy := r.vec(N*in, 1), r.vec(out*in, 0.2), r.vec(N*out, 1e-3)
	wt, dyt := func(i, j int) int { return i*in + j }, func(i, j int) int { return i*out + j }
	type casts struct {
		// the dequantized operands of each product: y: x, W; dx: dy, W; dW: dy, x.
		yx, yw, dxg, dxw, dwg, dwx []float64
	}
	hp := func(f func([]float32) []float64) casts {
		return casts{f(x), f(w), f(dy), f(w), f(dy), f(x)}
	}
	rowwise := casts{
		refCast(x, N, in, false, 1, true), refCast(w, out, in, false, 1, true),
		refCast(dy, N, out, false, 1, true), refCast(w, out, in, false, 2, true),
		refCast(dy, N, out, false, 2, true), refCast(x, N, in, false, 2, true),
	}
	gwhp := rowwise
	gwhp.dxw = refCast(w, out, in, false, 0, true)
	gwhp.dwg, gwhp.dwx = refBF16(dy), refBF16(x)
	for _, c := range []struct {
		name string
		prec model.Precision
		want casts
	}{
		{"float32", model.Precision{}, hp(ref32)},
		{"bfloat16", model.Precision{Param: backend.BFloat16}, hp(refBF16)},
		{"float8 tensorwise", f8prec(float8.Tensorwise, nil), casts{
			refCast(x, N, in, false, 0, false), refCast(w, out, in, false, 0, false),
			refCast(dy, N, out, true, 0, false), refCast(w, out, in, false, 0, false),
			refCast(dy, N, out, true, 0, false), refCast(x, N, in, false, 0, false),
		}},
		{"float8 rowwise", f8prec(float8.Rowwise, nil), rowwise},
		{"float8 rowwise_with_gw_hp", f8prec(float8.RowwiseGWHP, nil), gwhp},
		{"float8 filtered", f8prec(float8.Tensorwise, []string{"attention.wq"}), hp(refBF16)},
	} {
		t.Run(c.name, func(t *testing.T) {
			be := cpu.New(1)
			defer be.Close()
			m, err := New(be, cfg, 1, 8, Plan{Precision: c.prec})
			if err != nil {
				t.Fatal(err)
			}
			k := linKey{0, linWq}
			up := func(v []float32) backend.Tensor {
				t := be.Alloc(backend.Float32, len(v))
				be.Upload(t, v)
				return t
			}
			X, W, DY := up(x), up(w), up(dy)
			Y, DX, DW := up(make([]float32, N*out)), up(r.vec(N*in, 1)), up(r.vec(out*in, 1))
			dx0, dw0 := download(be, DX), download(be, DW)
			m.linear(k, Y, X, W, N, in, out, false)
			m.linearInputGrad(k, DX, DY, W, N, in, out, 1)
			m.linearWeightGrad(k, DW, DY, X, N, in, out)
			g := c.want
			wantY, absY := refMatmul(N, out, in, func(i, p int) float64 { return g.yx[i*in+p] }, func(p, j int) float64 { return g.yw[wt(j, p)] })
			wantDX, absDX := refMatmul(N, in, out, func(i, p int) float64 { return g.dxg[dyt(i, p)] }, func(p, j int) float64 { return g.dxw[wt(p, j)] })
			wantDW, absDW := refMatmul(out, in, N, func(i, p int) float64 { return g.dwg[dyt(p, i)] }, func(p, j int) float64 { return g.dwx[p*in+j] })
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
			check("y", download(be, Y), nil, wantY, absY, in)
			check("dx", download(be, DX), dx0, wantDX, absDX, out)
			check("dW", download(be, DW), dw0, wantDW, absDW, N)
		})
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
		r.s = splitmix(r.s)
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
	_, err = planModel(cfg, 1, 8, Plan{TP: 2, Comm: nilComm{}, Precision: f8prec(float8.Tensorwise, nil)})
	if err == nil || !contains(err.Error(), "model.converters") {
		t.Errorf("float8 under TP: error %v, want one naming model.converters", err)
	}
}

type nilComm struct{ ParallelComm }

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
