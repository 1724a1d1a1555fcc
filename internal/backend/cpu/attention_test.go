package cpu

import (
	"math"
	"slices"
	"testing"

	"github.com/titan-go/titan/internal/backend"
)

// refAttention is causal grouped-query attention in float64, computed
// directly from the definition.
func refAttention(q, k, v []float64, d backend.AttentionDims) (out, lse []float64) {
	out = make([]float64, d.B*d.Tq*d.NH*d.HD)
	lse = make([]float64, d.B*d.NH*d.Tq)
	group := d.NH / d.NKV
	scale := 1 / math.Sqrt(float64(d.HD))
	s := make([]float64, d.Tk)
	for b := 0; b < d.B; b++ {
		for h := 0; h < d.NH; h++ {
			kvh := h / group
			for i := 0; i < d.Tq; i++ {
				qi := q[((b*d.Tq+i)*d.NH+h)*d.HD:][:d.HD]
				oi := out[((b*d.Tq+i)*d.NH+h)*d.HD:][:d.HD]
				n := 0
				for j := 0; j < d.Tk; j++ {
					if d.KPos+j <= d.QPos+i {
						n = j + 1
					}
				}
				if n == 0 {
					lse[(b*d.NH+h)*d.Tq+i] = math.Inf(-1)
					continue
				}
				m := math.Inf(-1)
				for j := 0; j < n; j++ {
					kj := k[((b*d.Tk+j)*d.NKV+kvh)*d.HD:][:d.HD]
					var dotp float64
					for x := range qi {
						dotp += qi[x] * kj[x]
					}
					s[j] = dotp * scale
					m = math.Max(m, s[j])
				}
				var sum float64
				for j := 0; j < n; j++ {
					s[j] = math.Exp(s[j] - m)
					sum += s[j]
				}
				for j := 0; j < n; j++ {
					vj := v[((b*d.Tk+j)*d.NKV+kvh)*d.HD:][:d.HD]
					for x := range oi {
						oi[x] += s[j] / sum * vj[x]
					}
				}
				lse[(b*d.NH+h)*d.Tq+i] = m + math.Log(sum)
			}
		}
	}
	return out, lse
}

var attentionCases = []struct {
	name string
	d    backend.AttentionDims
	tile int
}{
	{"MHA/T19/tile8", backend.AttentionDims{B: 2, Tq: 19, Tk: 19, NH: 2, NKV: 2, HD: 8}, 8},
	{"GQA/NKV2", backend.AttentionDims{B: 1, Tq: 21, Tk: 21, NH: 4, NKV: 2, HD: 8}, 8},
	{"GQA/NKV1", backend.AttentionDims{B: 2, Tq: 12, Tk: 12, NH: 4, NKV: 1, HD: 4}, 4},
	{"T1", backend.AttentionDims{B: 2, Tq: 1, Tk: 1, NH: 2, NKV: 1, HD: 8}, 8},
	{"decode/Tq1", backend.AttentionDims{B: 1, Tq: 1, Tk: 17, NH: 4, NKV: 2, HD: 8, QPos: 16}, 8},
	{"cache/Tq5", backend.AttentionDims{B: 1, Tq: 5, Tk: 21, NH: 2, NKV: 1, HD: 8, QPos: 16}, 8},
	{"offsets/hidden-rows", backend.AttentionDims{B: 1, Tq: 13, Tk: 7, NH: 2, NKV: 2, HD: 8, QPos: 103, KPos: 106}, 4},
	{"ring/past-chunk", backend.AttentionDims{B: 1, Tq: 9, Tk: 11, NH: 2, NKV: 1, HD: 8, QPos: 11, KPos: 0}, 4},
	{"ring/future-chunk", backend.AttentionDims{B: 1, Tq: 6, Tk: 5, NH: 2, NKV: 1, HD: 8, QPos: 0, KPos: 6}, 4},
	{"Tk>Tq/KPos<QPos", backend.AttentionDims{B: 1, Tq: 10, Tk: 23, NH: 2, NKV: 2, HD: 8, QPos: 5, KPos: 0}, 8},
	{"default-tile/T150", backend.AttentionDims{B: 1, Tq: 150, Tk: 150, NH: 2, NKV: 1, HD: 16}, defaultAttnTile},
}

// attnRun is the result of one forward and backward on the backend.
type attnRun struct {
	out, lse, dq, dk, dv []float32
}

// runAttention runs forward and backward with the given configuration
// (fusedMin as Backend.attnFusedMin: 1 always fuses the backward, 1<<30
// never does, 0 decides by thread count).
// dq, dk and dv start at base values and are returned as the difference.
func runAttention(t *testing.T, threads, tile, fusedMin int, d backend.AttentionDims, q, k, v, dout, bq, bk, bv []float32) attnRun {
	b := newTestBackend(t, threads)
	b.attnTile, b.attnFusedMin = tile, fusedMin
	nq := len(q)
	qt, kt, vt := upload(b, q), upload(b, k), upload(b, v)
	out := upload(b, randF32(newRand(99), nq, 9)) // forward must overwrite
	lse := b.Alloc(backend.Float32, d.B*d.NH*d.Tq)
	b.AttentionForward(out, lse, qt, kt, vt, d)
	dq, getDQ := withBase(b, bq)
	dk, getDK := withBase(b, bk)
	dv, getDV := withBase(b, bv)
	b.AttentionBackward(dq, dk, dv, upload(b, dout), qt, kt, vt, out, lse, d)
	return attnRun{download(b, out), download(b, lse), getDQ(), getDK(), getDV()}
}

func TestAttention(t *testing.T) {
	for ci, tc := range attentionCases {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.d
			r := newRand(uint64(ci))
			nq, nk := d.B*d.Tq*d.NH*d.HD, d.B*d.Tk*d.NKV*d.HD
			q, k, v := randF32(r, nq, 2), randF32(r, nk, 2), randF32(r, nk, 1)
			w := randF32(r, nq, 1)
			bq, bk, bv := randF32(r, nq, 1), randF32(r, nk, 1), randF32(r, nk, 1)

			got := runAttention(t, 3, tc.tile, 1<<30, d, q, k, v, w, bq, bk, bv)
			q64, k64, v64, w64 := f64s(q), f64s(k), f64s(v), f64s(w)
			wantOut, wantLSE := refAttention(q64, k64, v64, d)
			checkClose(t, "out", got.out, wantOut, 2e-6, 2e-5)
			checkClose(t, "lse", got.lse, wantLSE, 2e-6, 2e-5)

			loss := func() float64 {
				out, _ := refAttention(q64, k64, v64, d)
				return weightedSum(out, w64)
			}
			checkGrads(t, r, loss, []gradInput{
				{"q", q64, got.dq}, {"k", k64, got.dk}, {"v", v64, got.dv},
			}, 40)

			// Every strategy and thread count gives the same bits.
			for _, cfg := range []struct {
				name              string
				threads, fusedMin int
			}{
				{"same config again", 3, 1 << 30},
				{"one thread", 1, 1 << 30},
				{"two threads, fused backward", 2, 1},
				{"one thread, fused backward", 1, 1},
				{"three threads, automatic strategy", 3, 0},
			} {
				again := runAttention(t, cfg.threads, tc.tile, cfg.fusedMin, d, q, k, v, w, bq, bk, bv)
				for _, c := range []struct {
					name      string
					got, want []float32
				}{
					{"out", again.out, got.out}, {"lse", again.lse, got.lse},
					{"dq", again.dq, got.dq}, {"dk", again.dk, got.dk}, {"dv", again.dv, got.dv},
				} {
					if !slices.Equal(f32bits(c.got), f32bits(c.want)) {
						t.Errorf("%s: %s differs from the first run", cfg.name, c.name)
					}
				}
			}
		})
	}
}

func f32bits(x []float32) []uint32 {
	y := make([]uint32, len(x))
	for i, v := range x {
		y[i] = math.Float32bits(v)
	}
	return y
}

func TestAttentionBackwardAccumulates(t *testing.T) {
	d := backend.AttentionDims{B: 1, Tq: 9, Tk: 9, NH: 2, NKV: 1, HD: 4}
	b := newTestBackend(t, 2)
	b.attnTile = 4
	r := newRand(7)
	nq, nk := d.B*d.Tq*d.NH*d.HD, d.B*d.Tk*d.NKV*d.HD
	q, k, v := upload(b, randF32(r, nq, 1)), upload(b, randF32(r, nk, 1)), upload(b, randF32(r, nk, 1))
	dout := upload(b, randF32(r, nq, 1))
	out, lse := b.Alloc(backend.Float32, nq), b.Alloc(backend.Float32, d.B*d.NH*d.Tq)
	b.AttentionForward(out, lse, q, k, v, d)
	grads := []backend.Tensor{b.Alloc(backend.Float32, nq), b.Alloc(backend.Float32, nk), b.Alloc(backend.Float32, nk)}
	b.AttentionBackward(grads[0], grads[1], grads[2], dout, q, k, v, out, lse, d)
	once := [][]float32{download(b, grads[0]), download(b, grads[1]), download(b, grads[2])}
	b.AttentionBackward(grads[0], grads[1], grads[2], dout, q, k, v, out, lse, d)
	for i, g := range grads {
		twice := download(b, g)
		checkClose(t, []string{"dq", "dk", "dv"}[i], twice, scaled(once[i], 2), 1e-6, 1e-6)
	}
}

// scaled returns s*x in float64.
func scaled(x []float32, s float64) []float64 {
	y := f64s(x)
	for i := range y {
		y[i] *= s
	}
	return y
}

func TestAttentionBadDims(t *testing.T) {
	b := newTestBackend(t, 1)
	x := b.Alloc(backend.Float32, 64)
	mustPanic(t, "NH not multiple of NKV", func() {
		b.AttentionForward(x, x, x, x, x, backend.AttentionDims{B: 1, Tq: 1, Tk: 1, NH: 3, NKV: 2, HD: 4})
	}, "AttentionForward", "NKV")
	mustPanic(t, "short q", func() {
		b.AttentionForward(x, x, x, x, x, backend.AttentionDims{B: 1, Tq: 20, Tk: 1, NH: 1, NKV: 1, HD: 4})
	}, "AttentionForward", "need 80")
	bf := b.Alloc(backend.BFloat16, 64)
	mustPanic(t, "bfloat16 q", func() {
		b.AttentionForward(x, x, bf, x, x, backend.AttentionDims{B: 1, Tq: 1, Tk: 1, NH: 1, NKV: 1, HD: 4})
	}, "AttentionForward", "q", "bfloat16")
}

// TestAttentionBF16: with BF16 the scores are products of the bfloat16
// roundings of q and k: the log-sum-exp matches the float64 reference on
// the rounded q, k within float32 error, and not the float32 path's; the
// output (probabilities rounded to bfloat16 before P·V) is within the
// bfloat16 bound of the rounded reference; the backward pass runs its
// products in bfloat16 too (its gradients differ from float32's by
// bfloat16 error, not more).
func TestAttentionBF16(t *testing.T) {
	d := backend.AttentionDims{B: 2, Tq: 70, Tk: 70, NH: 4, NKV: 2, HD: 32}
	r := newRand(5)
	nq, nk := d.B*d.Tq*d.NH*d.HD, d.B*d.Tk*d.NKV*d.HD
	q, k, v, dout := randF32(r, nq, 1), randF32(r, nk, 1), randF32(r, nk, 1), randF32(r, nq, 1)
	zq, zk := make([]float32, nq), make([]float32, nk)
	d16 := d
	d16.BF16 = true
	got := runAttention(t, 2, 32, 0, d16, q, k, v, dout, zq, zk, zk)
	f32 := runAttention(t, 2, 32, 0, d, q, k, v, dout, zq, zk, zk)
	rq, rk, rv := roundBF16s(q), roundBF16s(k), roundBF16s(v)
	wantOut, wantLse := refAttention(f64s(rq), f64s(rk), f64s(rv), d)
	worstLse32 := 0.0
	for i, w := range wantLse {
		if dl := math.Abs(float64(got.lse[i]) - w); dl > 1e-5*math.Max(1, math.Abs(w)) {
			t.Fatalf("lse[%d] = %v, want %v (scores of the rounded q, k)", i, got.lse[i], w)
		}
		worstLse32 = max(worstLse32, math.Abs(float64(f32.lse[i])-w))
	}
	if worstLse32 < 1e-4 {
		t.Errorf("the float32 path's lse is within %.3g of the rounded reference: the test cannot tell them apart", worstLse32)
	}
	for i, w := range wantOut {
		if do := math.Abs(float64(got.out[i]) - w); do > 1e-2 {
			t.Fatalf("out[%d] = %v, want %v within the bfloat16 bound", i, got.out[i], w)
		}
	}
	for name, pair := range map[string][2][]float32{"dq": {got.dq, f32.dq}, "dk": {got.dk, f32.dk}, "dv": {got.dv, f32.dv}} {
		var d2, n2 float64
		for i := range pair[0] {
			e := float64(pair[0][i] - pair[1][i])
			d2, n2 = d2+e*e, n2+float64(pair[1][i])*float64(pair[1][i])
		}
		if rel := math.Sqrt(d2 / n2); rel == 0 || rel > 2e-2 {
			t.Errorf("%s differs from float32's by %.3g (L2 relative): want bfloat16 error, above 0 and below 2e-2", name, rel)
		}
	}
}
