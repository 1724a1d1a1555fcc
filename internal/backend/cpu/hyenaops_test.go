package cpu

import (
	"math"
	"testing"

	"github.com/titan-go/titan/internal/backend"
)

// Float64 references of the operations the Hyena family adds: LayerNorm,
// GELU (tanh), row broadcast and sum, transpose, elementwise products,
// the channel skip term, the causal short convolution and the periodic
// activation.

func refLayerNorm(x, w, bias []float64, N, C int, eps float64) (out, mean, rstd []float64) {
	out, mean, rstd = make([]float64, N*C), make([]float64, N), make([]float64, N)
	for i := 0; i < N; i++ {
		var s float64
		for j := 0; j < C; j++ {
			s += x[i*C+j]
		}
		m := s / float64(C)
		var v float64
		for j := 0; j < C; j++ {
			v += (x[i*C+j] - m) * (x[i*C+j] - m)
		}
		r := 1 / math.Sqrt(v/float64(C)+eps)
		mean[i], rstd[i] = m, r
		for j := 0; j < C; j++ {
			out[i*C+j] = (x[i*C+j]-m)*r*w[j] + bias[j]
		}
	}
	return out, mean, rstd
}

func refGELUTanh(x []float64) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
	}
	return out
}

func refTranspose(x []float64, B, R, C int) []float64 {
	out := make([]float64, len(x))
	for b := 0; b < B; b++ {
		for r := 0; r < R; r++ {
			for c := 0; c < C; c++ {
				out[(b*C+c)*R+r] = x[(b*R+r)*C+c]
			}
		}
	}
	return out
}

func refChannelScaleAdd(a, x, w []float64, B, C, L int) []float64 {
	out := make([]float64, len(a))
	for b := 0; b < B; b++ {
		for c := 0; c < C; c++ {
			for l := 0; l < L; l++ {
				i := (b*C+c)*L + l
				out[i] = a[i] + w[c]*x[i]
			}
		}
	}
	return out
}

func refShortConv(x, w, bias []float64, B, C, L, K int) []float64 {
	out := make([]float64, len(x))
	for b := 0; b < B; b++ {
		for c := 0; c < C; c++ {
			row := (b*C + c) * L
			for t := 0; t < L; t++ {
				s := bias[c]
				for k := 0; k < K; k++ {
					if j := t - K + 1 + k; j >= 0 {
						s += w[c*K+k] * x[row+j]
					}
				}
				out[row+t] = s
			}
		}
	}
	return out
}

func refSin(x, f []float64, N, C int) []float64 {
	out := make([]float64, len(x))
	for i := 0; i < N; i++ {
		for j := 0; j < C; j++ {
			out[i*C+j] = math.Sin(f[j] * x[i*C+j])
		}
	}
	return out
}

func TestLayerNorm(t *testing.T) {
	const eps = 1e-5
	for _, tc := range []struct {
		name    string
		N, C    int
		shift   float64 // added to every input: the mean must not hurt
		threads int
	}{
		{"one row", 1, 8, 0, 1},
		{"odd", 5, 37, 0, 2},
		{"offset", 7, 20, 30, 2},
		{"many rows", 300, 20, 0, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.threads)
			r := newRand(21)
			x := randF32(r, tc.N*tc.C, 2)
			for i := range x {
				x[i] += float32(tc.shift)
			}
			w, bias := randF32(r, tc.C, 1.5), randF32(r, tc.C, 1)
			xt, wt, bt := upload(b, x), upload(b, w), upload(b, bias)
			out := b.Alloc(backend.Float32, tc.N*tc.C)
			mean, rstd := b.Alloc(backend.Float32, tc.N), b.Alloc(backend.Float32, tc.N)
			b.LayerNormForward(out, mean, rstd, xt, wt, bt, tc.N, tc.C, eps)
			x64, w64, b64 := f64s(x), f64s(w), f64s(bias)
			wantOut, wantMean, wantRstd := refLayerNorm(x64, w64, b64, tc.N, tc.C, eps)
			checkClose(t, "out", download(b, out), wantOut, 1e-5, 1e-5)
			checkClose(t, "mean", download(b, mean), wantMean, 1e-6, 1e-6)
			checkClose(t, "rstd", download(b, rstd), wantRstd, 0, 1e-6)

			dout := randF32(r, tc.N*tc.C, 1)
			dx, getDX := withBase(b, randF32(r, tc.N*tc.C, 1))
			dw, getDW := withBase(b, randF32(r, tc.C, 1))
			db, getDB := withBase(b, randF32(r, tc.C, 1))
			b.LayerNormBackward(dx, dw, db, upload(b, dout), xt, wt, mean, rstd, tc.N, tc.C)
			d64 := f64s(dout)
			loss := func() float64 {
				o, _, _ := refLayerNorm(x64, w64, b64, tc.N, tc.C, eps)
				return weightedSum(o, d64)
			}
			checkGrads(t, r, loss, []gradInput{{"inp", x64, getDX()}, {"weight", w64, getDW()}, {"bias", b64, getDB()}}, 60)
		})
	}
}

func TestLayerNormInPlace(t *testing.T) {
	b := newTestBackend(t, 2)
	r := newRand(22)
	x, w, bias := randF32(r, 4*9, 1), randF32(r, 9, 1), randF32(r, 9, 1)
	xt, wt, bt := upload(b, x), upload(b, w), upload(b, bias)
	want := b.Alloc(backend.Float32, len(x))
	mean, rstd := b.Alloc(backend.Float32, 4), b.Alloc(backend.Float32, 4)
	b.LayerNormForward(want, mean, rstd, xt, wt, bt, 4, 9, 1e-5)
	b.LayerNormForward(xt, mean, rstd, xt, wt, bt, 4, 9, 1e-5)
	checkClose(t, "in place", download(b, xt), f64s(download(b, want)), 0, 0)
}

func TestGELUTanh(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int
		scale   float64
		threads int
	}{
		{"small", 7, 3, 1},
		{"blocks", 1000, 4, 2},
		{"saturated", 300, 60, 3}, // the sigmoid's exp overflows and underflows
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.threads)
			r := newRand(23)
			x := randF32(r, tc.n, tc.scale)
			xt := upload(b, x)
			out := b.Alloc(backend.Float32, tc.n)
			b.GELUTanhForward(out, xt, tc.n)
			x64 := f64s(x)
			checkClose(t, "out", download(b, out), refGELUTanh(x64), 1e-6, 1e-5)

			dout := randF32(r, tc.n, 1)
			dx, get := withBase(b, randF32(r, tc.n, 1))
			b.GELUTanhBackward(dx, upload(b, dout), xt, tc.n)
			d64 := f64s(dout)
			checkGrads(t, r, func() float64 { return weightedSum(refGELUTanh(x64), d64) },
				[]gradInput{{"inp", x64, get()}}, 100)
		})
	}
}

func TestBroadcastAndSumRows(t *testing.T) {
	for _, tc := range []struct {
		name    string
		N, C    int
		threads int
	}{
		{"one row", 1, 5, 1},
		{"strips", 33, 40, 2},
		{"tall", 2000, 3, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.threads)
			r := newRand(24)
			row := randF32(r, tc.C, 1)
			out := upload(b, randF32(r, tc.N*tc.C, 1))
			b.BroadcastRows(out, upload(b, row), tc.N, tc.C)
			want := make([]float64, tc.N*tc.C)
			for i := range want {
				want[i] = float64(row[i%tc.C])
			}
			checkClose(t, "broadcast", download(b, out), want, 0, 0)

			src := randF32(r, tc.N*tc.C, 1)
			base := randF32(r, tc.C, 1)
			dst := upload(b, base)
			b.SumRows(dst, upload(b, src), tc.N, tc.C)
			sums := f64s(base)
			for i, v := range src {
				sums[i%tc.C] += float64(v)
			}
			checkClose(t, "sum", download(b, dst), sums, 1e-6, 1e-6)
		})
	}
}

func TestTranspose(t *testing.T) {
	for _, tc := range []struct {
		name    string
		B, R, C int
		threads int
	}{
		{"vector", 1, 1, 9, 1},
		{"square", 1, 32, 32, 2},
		{"ragged tiles", 3, 45, 70, 3},
		{"tall", 2, 200, 3, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.threads)
			x := randF32(newRand(25), tc.B*tc.R*tc.C, 1)
			out := b.Alloc(backend.Float32, len(x))
			b.Transpose(out, upload(b, x), tc.B, tc.R, tc.C)
			checkClose(t, "out", download(b, out), refTranspose(f64s(x), tc.B, tc.R, tc.C), 0, 0)
		})
	}
	b := newTestBackend(t, 1)
	x := b.Alloc(backend.Float32, 8)
	mustPanic(t, "overlap", func() { b.Transpose(x.Slice(2, 4), x.Slice(0, 4), 1, 2, 2) }, "Transpose", "overlap")
}

func TestMul(t *testing.T) {
	for _, n := range []int{1, 13, 70000} {
		b := newTestBackend(t, 3)
		r := newRand(26)
		x, y := randF32(r, n, 2), randF32(r, n, 2)
		xt, yt := upload(b, x), upload(b, y)
		out := b.Alloc(backend.Float32, n)
		b.Mul(out, xt, yt)
		want := make([]float64, n)
		for i := range want {
			want[i] = float64(x[i]) * float64(y[i])
		}
		checkClose(t, "out", download(b, out), want, 0, 1e-7)

		dout := randF32(r, n, 1)
		dx, getDX := withBase(b, randF32(r, n, 1))
		dy, getDY := withBase(b, randF32(r, n, 1))
		b.MulBackward(dx, dy, upload(b, dout), xt, yt)
		x64, y64, d64 := f64s(x), f64s(y), f64s(dout)
		loss := func() float64 {
			var s float64
			for i := range x64 {
				s += x64[i] * y64[i] * d64[i]
			}
			return s
		}
		checkGrads(t, r, loss, []gradInput{{"a", x64, getDX()}, {"b", y64, getDY()}}, 50)
		// A nil gradient is skipped.
		dOnly, get := withBase(b, randF32(r, n, 1))
		b.MulBackward(dOnly, backend.Tensor{}, upload(b, dout), backend.Tensor{}, yt)
		checkClose(t, "da alone", get(), f64s(getDX()), 1e-6, 1e-6)
	}
}

func TestChannelScaleAdd(t *testing.T) {
	for _, tc := range []struct {
		name    string
		B, C, L int
		threads int
	}{
		{"one", 1, 1, 5, 1},
		{"batched", 3, 7, 11, 2},
		{"step", 4, 9, 1, 3}, // token-major rows of one position
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.threads)
			r := newRand(27)
			n := tc.B * tc.C * tc.L
			a, x, w := randF32(r, n, 1), randF32(r, n, 1), randF32(r, tc.C, 2)
			at, xt, wt := upload(b, a), upload(b, x), upload(b, w)
			out := b.Alloc(backend.Float32, n)
			b.ChannelScaleAdd(out, at, xt, wt, tc.B, tc.C, tc.L)
			a64, x64, w64 := f64s(a), f64s(x), f64s(w)
			checkClose(t, "out", download(b, out), refChannelScaleAdd(a64, x64, w64, tc.B, tc.C, tc.L), 1e-7, 1e-6)
			b.ChannelScaleAdd(at, at, xt, wt, tc.B, tc.C, tc.L)
			checkClose(t, "in place", download(b, at), f64s(download(b, out)), 0, 0)

			dout := randF32(r, n, 1)
			dx, getDX := withBase(b, randF32(r, n, 1))
			dw, getDW := withBase(b, randF32(r, tc.C, 1))
			b.ChannelScaleAddBackward(dx, dw, upload(b, dout), xt, wt, tc.B, tc.C, tc.L)
			d64 := f64s(dout)
			loss := func() float64 { return weightedSum(refChannelScaleAdd(a64, x64, w64, tc.B, tc.C, tc.L), d64) }
			checkGrads(t, r, loss, []gradInput{{"x", x64, getDX()}, {"w", w64, getDW()}}, 60)
		})
	}
}

func TestShortConv(t *testing.T) {
	for _, tc := range []struct {
		name       string
		B, C, L, K int
		threads    int
	}{
		{"width 3", 1, 2, 6, 3, 1},
		{"batched", 3, 5, 17, 3, 2},
		{"shorter than the filter", 2, 3, 2, 4, 3},
		{"width 1", 2, 4, 5, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.threads)
			r := newRand(28)
			n := tc.B * tc.C * tc.L
			x, w, bias := randF32(r, n, 1), randF32(r, tc.C*tc.K, 1), randF32(r, tc.C, 1)
			xt, wt, bt := upload(b, x), upload(b, w), upload(b, bias)
			out := b.Alloc(backend.Float32, n)
			b.ShortConvForward(out, xt, wt, bt, tc.B, tc.C, tc.L, tc.K)
			x64, w64, b64 := f64s(x), f64s(w), f64s(bias)
			want := refShortConv(x64, w64, b64, tc.B, tc.C, tc.L, tc.K)
			got := download(b, out)
			checkClose(t, "out", got, want, 1e-6, 1e-6)

			dout := randF32(r, n, 1)
			dx, getDX := withBase(b, randF32(r, n, 1))
			dw, getDW := withBase(b, randF32(r, tc.C*tc.K, 1))
			db, getDB := withBase(b, randF32(r, tc.C, 1))
			b.ShortConvBackward(dx, dw, db, upload(b, dout), xt, wt, tc.B, tc.C, tc.L, tc.K)
			d64 := f64s(dout)
			loss := func() float64 { return weightedSum(refShortConv(x64, w64, b64, tc.B, tc.C, tc.L, tc.K), d64) }
			checkGrads(t, r, loss, []gradInput{{"inp", x64, getDX()}, {"weight", w64, getDW()}, {"bias", b64, getDB()}}, 80)

			// Stepping position by position gives the forward's bits.
			state := b.Alloc(backend.Float32, tc.B*tc.C*(tc.K-1))
			in, o := b.Alloc(backend.Float32, tc.B*tc.C), b.Alloc(backend.Float32, tc.B*tc.C)
			col := make([]float32, tc.B*tc.C)
			for s := 0; s < tc.L; s++ {
				for i := range col {
					col[i] = x[i*tc.L+s]
				}
				b.Upload(in, col)
				b.ShortConvStep(o, state, in, wt, bt, tc.B, tc.C, tc.K)
				step := download(b, o)
				for i, v := range step {
					if v != got[i*tc.L+s] {
						t.Fatalf("step %d, row %d: %v, forward %v", s, i, v, got[i*tc.L+s])
					}
				}
			}
		})
	}
}

func TestSin(t *testing.T) {
	for _, tc := range []struct {
		name    string
		N, C    int
		threads int
	}{
		{"small", 3, 4, 1},
		{"strips", 50, 40, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.threads)
			r := newRand(29)
			x, f := randF32(r, tc.N*tc.C, 2), randF32(r, tc.C, 10)
			xt, ft := upload(b, x), upload(b, f)
			out := b.Alloc(backend.Float32, tc.N*tc.C)
			b.SinForward(out, xt, ft, tc.N, tc.C)
			x64, f64 := f64s(x), f64s(f)
			checkClose(t, "out", download(b, out), refSin(x64, f64, tc.N, tc.C), 1e-5, 1e-5)

			dout := randF32(r, tc.N*tc.C, 1)
			dx, getDX := withBase(b, randF32(r, tc.N*tc.C, 1))
			df, getDF := withBase(b, randF32(r, tc.C, 1))
			b.SinBackward(dx, df, upload(b, dout), xt, ft, tc.N, tc.C)
			d64 := f64s(dout)
			loss := func() float64 { return weightedSum(refSin(x64, f64, tc.N, tc.C), d64) }
			checkGrads(t, r, loss, []gradInput{{"inp", x64, getDX()}, {"freq", f64, getDF()}}, 60)
		})
	}
}

// TestHyenaBackwardsAccumulate runs each of the Hyena operations'
// backward passes twice into the same buffers and checks that the second
// call added as much as the first.
func TestHyenaBackwardsAccumulate(t *testing.T) {
	b := newTestBackend(t, 2)
	r := newRand(30)
	const N, C, K = 6, 10, 3
	x, w, d := upload(b, randF32(r, N*C, 1)), upload(b, randF32(r, C, 1)), upload(b, randF32(r, N*C, 1))
	cw := upload(b, randF32(r, C*K, 1))
	mean, rstd := b.Alloc(backend.Float32, N), b.Alloc(backend.Float32, N)
	b.LayerNormForward(b.Alloc(backend.Float32, N*C), mean, rstd, x, w, w, N, C, 1e-5)
	for _, tc := range []struct {
		name  string
		sizes []int
		run   func(g []backend.Tensor)
	}{
		{"LayerNorm", []int{N * C, C, C}, func(g []backend.Tensor) { b.LayerNormBackward(g[0], g[1], g[2], d, x, w, mean, rstd, N, C) }},
		{"GELUTanh", []int{N * C}, func(g []backend.Tensor) { b.GELUTanhBackward(g[0], d, x, N*C) }},
		{"SumRows", []int{C}, func(g []backend.Tensor) { b.SumRows(g[0], d, N, C) }},
		{"Mul", []int{N * C, N * C}, func(g []backend.Tensor) { b.MulBackward(g[0], g[1], d, x, d) }},
		{"ChannelScaleAdd", []int{N * C, C}, func(g []backend.Tensor) { b.ChannelScaleAddBackward(g[0], g[1], d, x, w, 2, C, 3) }},
		{"ShortConv", []int{N * C, C * K, C}, func(g []backend.Tensor) { b.ShortConvBackward(g[0], g[1], g[2], d, x, cw, 2, C, 3, K) }},
		{"Sin", []int{N * C, C}, func(g []backend.Tensor) { b.SinBackward(g[0], g[1], d, x, w, N, C) }},
	} {
		grads := make([]backend.Tensor, len(tc.sizes))
		for i, n := range tc.sizes {
			grads[i] = b.Alloc(backend.Float32, n)
		}
		tc.run(grads)
		once := make([][]float32, len(grads))
		for i, g := range grads {
			once[i] = download(b, g)
		}
		tc.run(grads)
		for i, g := range grads {
			checkClose(t, tc.name, download(b, g), scaled(once[i], 2), 1e-6, 1e-6)
		}
	}
}

// TestHyenaOpsIndependentOfThreads: the reductions (weight, bias and
// frequency gradients) give the same bits on one worker and on three.
func TestHyenaOpsIndependentOfThreads(t *testing.T) {
	r := newRand(31)
	const N, C, K = 700, 37, 3
	x, w, d, cw := randF32(r, N*C, 1), randF32(r, C, 1), randF32(r, N*C, 1), randF32(r, C*K, 1)
	run := func(threads int) [][]float32 {
		b := newTestBackend(t, threads)
		xt, wt, dt, cwt := upload(b, x), upload(b, w), upload(b, d), upload(b, cw)
		mean, rstd := b.Alloc(backend.Float32, N), b.Alloc(backend.Float32, N)
		b.LayerNormForward(b.Alloc(backend.Float32, N*C), mean, rstd, xt, wt, wt, N, C, 1e-5)
		g := func(n int) backend.Tensor { return b.Alloc(backend.Float32, n) }
		lnx, lnw, lnb := g(N*C), g(C), g(C)
		b.LayerNormBackward(lnx, lnw, lnb, dt, xt, wt, mean, rstd, N, C)
		sr := g(C)
		b.SumRows(sr, dt, N, C)
		csx, csw := g(N*C), g(C)
		b.ChannelScaleAddBackward(csx, csw, dt, xt, wt, 10, C, N/10)
		scx, scw, scb := g(N*C), g(C*K), g(C)
		b.ShortConvBackward(scx, scw, scb, dt, xt, cwt, 10, C, N/10, K)
		snx, snf := g(N*C), g(C)
		b.SinBackward(snx, snf, dt, xt, wt, N, C)
		var out [][]float32
		for _, t := range []backend.Tensor{lnx, lnw, lnb, sr, csx, csw, scx, scw, scb, snx, snf} {
			out = append(out, download(b, t))
		}
		return out
	}
	one, three := run(1), run(3)
	for i := range one {
		for j := range one[i] {
			if one[i][j] != three[i][j] {
				t.Fatalf("result %d element %d: %v on one worker, %v on three", i, j, one[i][j], three[i][j])
			}
		}
	}
}
