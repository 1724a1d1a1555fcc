package cpu

import (
	"math"
	"testing"

	"github.com/titan-go/titan/internal/backend"
)

// Float64 references of the layer operations.

func refEmbedding(table []float64, tokens []int32, C int) []float64 {
	out := make([]float64, len(tokens)*C)
	for i, t := range tokens {
		copy(out[i*C:(i+1)*C], table[int(t)*C:(int(t)+1)*C])
	}
	return out
}

func refRMSNorm(x, w []float64, N, C int, eps float64) (out, rstd []float64) {
	out = make([]float64, N*C)
	rstd = make([]float64, N)
	for i := 0; i < N; i++ {
		var ss float64
		for j := 0; j < C; j++ {
			ss += x[i*C+j] * x[i*C+j]
		}
		rstd[i] = 1 / math.Sqrt(ss/float64(C)+eps)
		for j := 0; j < C; j++ {
			out[i*C+j] = x[i*C+j] * rstd[i] * w[j]
		}
	}
	return out, rstd
}

func refRoPE(x, cos, sin []float64, B, T, NH, HD int) []float64 {
	out := make([]float64, len(x))
	for b := 0; b < B; b++ {
		for t := 0; t < T; t++ {
			for h := 0; h < NH; h++ {
				off := ((b*T+t)*NH + h) * HD
				for i := 0; i < HD/2; i++ {
					c, s := cos[t*HD/2+i], sin[t*HD/2+i]
					x0, x1 := x[off+2*i], x[off+2*i+1]
					// (x0 + i x1) * (c + i s)
					out[off+2*i] = x0*c - x1*s
					out[off+2*i+1] = x0*s + x1*c
				}
			}
		}
	}
	return out
}

func refSwiGLU(g, u []float64) []float64 {
	out := make([]float64, len(g))
	for i := range g {
		out[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
	}
	return out
}

func TestEmbedding(t *testing.T) {
	for _, tc := range []struct {
		name       string
		N, C, rows int
		threads    int
	}{
		{"small", 7, 5, 4, 1},
		{"repeats", 40, 33, 3, 3},
		{"wide", 9, 70, 20, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.threads)
			r := newRand(1)
			table := randF32(r, tc.rows*tc.C, 1)
			tokens := make([]int32, tc.N)
			for i := range tokens {
				tokens[i] = int32(r.IntN(tc.rows))
			}
			tab, tok := upload(b, table), uploadI32(b, tokens)
			out := upload(b, randF32(r, tc.N*tc.C, 1))
			b.EmbeddingForward(out, tab, tok, tc.N, tc.C)
			tab64 := f64s(table)
			checkClose(t, "out", download(b, out), refEmbedding(tab64, tokens, tc.C), 0, 0)

			w := randF32(r, tc.N*tc.C, 1)
			dtab, get := withBase(b, randF32(r, len(table), 1))
			b.EmbeddingBackward(dtab, upload(b, w), tok, tc.N, tc.C)
			w64 := f64s(w)
			checkGrads(t, r, func() float64 {
				return weightedSum(refEmbedding(tab64, tokens, tc.C), w64)
			}, []gradInput{{"table", tab64, get()}}, 1000)
		})
	}
}

func TestEmbeddingBadToken(t *testing.T) {
	b := newTestBackend(t, 1)
	tab, out := b.Alloc(backend.Float32, 8), b.Alloc(backend.Float32, 8)
	tok := uploadI32(b, []int32{0, 4})
	mustPanic(t, "forward", func() { b.EmbeddingForward(out, tab, tok, 2, 4) }, "EmbeddingForward", "token 4")
	mustPanic(t, "backward", func() { b.EmbeddingBackward(tab, out, tok, 2, 4) }, "EmbeddingBackward", "token 4")
}

func TestRMSNorm(t *testing.T) {
	const eps = 1e-5
	for _, tc := range []struct {
		name    string
		N, C    int
		threads int
	}{
		{"one row", 1, 8, 1},
		{"odd", 5, 37, 2},
		{"many rows", 300, 20, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.threads)
			r := newRand(2)
			x, w := randF32(r, tc.N*tc.C, 2), randF32(r, tc.C, 1.5)
			xt, wt := upload(b, x), upload(b, w)
			out, rstd := b.Alloc(backend.Float32, tc.N*tc.C), b.Alloc(backend.Float32, tc.N)
			b.RMSNormForward(out, rstd, xt, wt, tc.N, tc.C, eps)
			x64, w64 := f64s(x), f64s(w)
			wantOut, wantRstd := refRMSNorm(x64, w64, tc.N, tc.C, eps)
			checkClose(t, "out", download(b, out), wantOut, 1e-6, 1e-5)
			checkClose(t, "rstd", download(b, rstd), wantRstd, 0, 1e-6)

			dout := randF32(r, tc.N*tc.C, 1)
			dx, getDX := withBase(b, randF32(r, tc.N*tc.C, 1))
			dw, getDW := withBase(b, randF32(r, tc.C, 1))
			b.RMSNormBackward(dx, dw, upload(b, dout), xt, wt, rstd, tc.N, tc.C)
			d64 := f64s(dout)
			loss := func() float64 {
				o, _ := refRMSNorm(x64, w64, tc.N, tc.C, eps)
				return weightedSum(o, d64)
			}
			checkGrads(t, r, loss, []gradInput{{"inp", x64, getDX()}, {"weight", w64, getDW()}}, 60)
		})
	}
}

func TestRMSNormInPlace(t *testing.T) {
	b := newTestBackend(t, 2)
	x := randF32(newRand(3), 4*9, 1)
	w := randF32(newRand(4), 9, 1)
	xt, wt := upload(b, x), upload(b, w)
	want := b.Alloc(backend.Float32, len(x))
	rstd := b.Alloc(backend.Float32, 4)
	b.RMSNormForward(want, rstd, xt, wt, 4, 9, 1e-6)
	b.RMSNormForward(xt, rstd, xt, wt, 4, 9, 1e-6)
	checkClose(t, "in place", download(b, xt), f64s(download(b, want)), 0, 0)
}

func TestRoPE(t *testing.T) {
	for _, tc := range []struct {
		name           string
		B, T, NH, HD   int
		threads        int
		inPlace        bool
		sampleGradsPer int
	}{
		{"small", 1, 3, 2, 4, 1, false, 100},
		{"batched", 3, 5, 3, 8, 3, false, 100},
		{"in place", 2, 7, 2, 6, 2, true, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.threads)
			r := newRand(5)
			n := tc.B * tc.T * tc.NH * tc.HD
			half := tc.HD / 2
			cos, sin := make([]float32, tc.T*half), make([]float32, tc.T*half)
			for i := range cos {
				a := 2 * math.Pi * r.Float64()
				cos[i], sin[i] = float32(math.Cos(a)), float32(math.Sin(a))
			}
			x := randF32(r, n, 1)
			xt, ct, st := upload(b, x), upload(b, cos), upload(b, sin)
			out := xt
			if !tc.inPlace {
				out = b.Alloc(backend.Float32, n)
			}
			x64, c64, s64 := f64s(x), f64s(cos), f64s(sin)
			want := refRoPE(x64, c64, s64, tc.B, tc.T, tc.NH, tc.HD)
			b.RoPEForward(out, xt, ct, st, tc.B, tc.T, tc.NH, tc.HD)
			checkClose(t, "out", download(b, out), want, 1e-6, 1e-6)

			dout := randF32(r, n, 1)
			dx, get := withBase(b, randF32(r, n, 1))
			b.RoPEBackward(dx, upload(b, dout), ct, st, tc.B, tc.T, tc.NH, tc.HD)
			d64 := f64s(dout)
			checkGrads(t, r, func() float64 {
				return weightedSum(refRoPE(x64, c64, s64, tc.B, tc.T, tc.NH, tc.HD), d64)
			}, []gradInput{{"inp", x64, get()}}, tc.sampleGradsPer)
		})
	}
}

func TestSwiGLU(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int
		scale   float64
		threads int
	}{
		{"small", 7, 3, 1},
		{"blocks", 1000, 6, 2},
		{"saturated", 300, 120, 3}, // exp(-gate) overflows and underflows
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.threads)
			r := newRand(6)
			g, u := randF32(r, tc.n, tc.scale), randF32(r, tc.n, 2)
			gt, ut := upload(b, g), upload(b, u)
			out := b.Alloc(backend.Float32, tc.n)
			b.SwiGLUForward(out, gt, ut, tc.n)
			g64, u64 := f64s(g), f64s(u)
			checkClose(t, "out", download(b, out), refSwiGLU(g64, u64), 1e-6, 1e-5)

			dout := randF32(r, tc.n, 1)
			dg, getDG := withBase(b, randF32(r, tc.n, 1))
			du, getDU := withBase(b, randF32(r, tc.n, 1))
			b.SwiGLUBackward(dg, du, upload(b, dout), gt, ut, tc.n)
			d64 := f64s(dout)
			checkGrads(t, r, func() float64 {
				return weightedSum(refSwiGLU(g64, u64), d64)
			}, []gradInput{{"gate", g64, getDG()}, {"up", u64, getDU()}}, 100)
		})
	}
}

// TestBackwardAccumulates runs every layer backward twice into the same
// buffers and checks that the second call added as much as the first.
func TestBackwardAccumulates(t *testing.T) {
	b := newTestBackend(t, 2)
	r := newRand(8)
	const N, C = 6, 10
	x, w, d := upload(b, randF32(r, N*C, 1)), upload(b, randF32(r, C, 1)), upload(b, randF32(r, N*C, 1))
	rstd := b.Alloc(backend.Float32, N)
	b.RMSNormForward(b.Alloc(backend.Float32, N*C), rstd, x, w, N, C, 1e-5)
	tok := uploadI32(b, []int32{1, 0, 1, 1, 3, 2})
	cs, sn := upload(b, randF32(r, 3*5, 1)), upload(b, randF32(r, 3*5, 1))
	for _, tc := range []struct {
		name  string
		sizes []int
		run   func(g []backend.Tensor)
	}{
		{"Embedding", []int{4 * C}, func(g []backend.Tensor) { b.EmbeddingBackward(g[0], d, tok, N, C) }},
		{"RMSNorm", []int{N * C, C}, func(g []backend.Tensor) { b.RMSNormBackward(g[0], g[1], d, x, w, rstd, N, C) }},
		{"RoPE", []int{N * C}, func(g []backend.Tensor) { b.RoPEBackward(g[0], d, cs, sn, 2, 3, 1, C) }},
		{"SwiGLU", []int{N * C, N * C}, func(g []backend.Tensor) { b.SwiGLUBackward(g[0], g[1], d, x, d, N*C) }},
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
