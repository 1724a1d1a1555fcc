package cpu

import "github.com/titan-go/titan/internal/backend"

// GELU with the tanh approximation, written through the sigmoid:
// 0.5·x·(1 + tanh(u)) = x·σ(2u) with u = sqrt(2/π)·(x + 0.044715·x³),
// so that it runs on the vectorised sigmoid kernel.
const (
	geluK  = 0.7978845608028654 // sqrt(2/π)
	geluK3 = 0.044715
)

// geluArg sets dst[i] = 2u(src[i]), the sigmoid's argument.
func geluArg(dst, src []float32) {
	src = src[:len(dst)]
	for i, x := range src {
		dst[i] = 2 * geluK * (x + geluK3*x*x*x)
	}
}

// GELUTanhForward computes out = x·σ(2·sqrt(2/π)·(x + 0.044715·x³)) over
// n elements, which is PyTorch's gelu(x, approximate="tanh"). out may
// alias inp.
func (b *Backend) GELUTanhForward(out, inp backend.Tensor, n int) {
	const op = "GELUTanhForward"
	o := f32n(op, "out", out, n)
	x := f32n(op, "inp", inp, n)
	b.pool.For(n, elemGrain/4, func(lo, hi int) {
		x := x[lo:hi]
		o := o[lo:hi][:len(x)]
		var s [expBlock]float32
		for k := 0; k < len(x); k += expBlock {
			m := min(expBlock, len(x)-k)
			xs, ss := x[k:k+m], s[:m]
			geluArg(ss, xs)
			sigmoid(ss, ss)
			for i, v := range xs[:len(ss)] {
				o[k+i] = v * ss[i]
			}
		}
	})
}

// GELUTanhBackward accumulates dinp += dout·(s + x·s·(1-s)·2u'(x)) with
// s = σ(2u(x)) and u'(x) = sqrt(2/π)·(1 + 3·0.044715·x²).
func (b *Backend) GELUTanhBackward(dinp, dout, inp backend.Tensor, n int) {
	const op = "GELUTanhBackward"
	dx := f32n(op, "dinp", dinp, n)
	d := f32n(op, "dout", dout, n)
	x := f32n(op, "inp", inp, n)
	b.pool.For(n, elemGrain/4, func(lo, hi int) {
		x := x[lo:hi]
		dx := dx[lo:hi][:len(x)]
		d := d[lo:hi][:len(x)]
		var s [expBlock]float32
		for k := 0; k < len(x); k += expBlock {
			m := min(expBlock, len(x)-k)
			xs, ss := x[k:k+m], s[:m]
			geluArg(ss, xs)
			sigmoid(ss, ss)
			ds, dxs := d[k : k+m][:len(ss)], dx[k : k+m][:len(ss)]
			for i, v := range xs[:len(ss)] {
				si := ss[i]
				du := 2 * geluK * (1 + 3*geluK3*v*v)
				dxs[i] += ds[i] * (si + v*si*(1-si)*du)
			}
		}
	})
}
