package cpu

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
)

// Mul computes out = a ⊙ b elementwise; out may alias a or b.
func (b *Backend) Mul(out, x, y backend.Tensor) {
	const op = "Mul"
	n := out.Len
	if x.Len != n || y.Len != n {
		panic(fmt.Sprintf("cpu: %s: lengths differ (out %d, a %d, b %d)", op, n, x.Len, y.Len))
	}
	o, xs, ys := f32(op, "out", out), f32(op, "a", x), f32(op, "b", y)
	b.pool.For(n, elemGrain, func(lo, hi int) {
		o, xs, ys := o[lo:hi], xs[lo:hi], ys[lo:hi]
		xs, ys = xs[:len(o)], ys[:len(o)]
		for i := range o {
			o[i] = xs[i] * ys[i]
		}
	})
}

// MulBackward accumulates da += dout ⊙ b and db += dout ⊙ a; a gradient
// tensor with nil Mem is skipped.
func (b *Backend) MulBackward(da, db, dout, x, y backend.Tensor) {
	const op = "MulBackward"
	n := dout.Len
	d := f32(op, "dout", dout)
	var dxs, dys, xs, ys []float32
	if da.Mem != nil {
		dxs, ys = f32n(op, "da", da, n), f32n(op, "b", y, n)
	}
	if db.Mem != nil {
		dys, xs = f32n(op, "db", db, n), f32n(op, "a", x, n)
	}
	b.pool.For(n, elemGrain, func(lo, hi int) {
		d := d[lo:hi]
		if dxs != nil {
			dx, y := dxs[lo:hi][:len(d)], ys[lo:hi][:len(d)]
			for i, v := range d {
				dx[i] += v * y[i]
			}
		}
		if dys != nil {
			dy, x := dys[lo:hi][:len(d)], xs[lo:hi][:len(d)]
			for i, v := range d {
				dy[i] += v * x[i]
			}
		}
	})
}

// ChannelScaleAdd computes out[b,c,l] = a[b,c,l] + w[c]·x[b,c,l] over
// channel-major [B, C, L] buffers; out may alias a.
func (b *Backend) ChannelScaleAdd(out, a, x, w backend.Tensor, B, C, L int) {
	const op = "ChannelScaleAdd"
	n := B * C * L
	o := f32n(op, "out", out, n)
	as := f32n(op, "a", a, n)
	xs := f32n(op, "x", x, n)
	ws := f32n(op, "w", w, C)
	b.pool.For(B*C, rowGrain(L), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			wc := ws[r%C]
			oi, ai, xi := o[r*L:(r+1)*L], as[r*L:(r+1)*L], xs[r*L:(r+1)*L]
			ai, xi = ai[:len(oi)], xi[:len(oi)]
			for i := range oi {
				oi[i] = ai[i] + wc*xi[i]
			}
		}
	})
}

// ChannelScaleAddBackward accumulates dx[b,c,l] += w[c]·dout[b,c,l] and
// dw[c] += Σ_{b,l} dout[b,c,l]·x[b,c,l], the latter in float64 in a fixed
// order (b, then l).
func (b *Backend) ChannelScaleAddBackward(dx, dw, dout, x, w backend.Tensor, B, C, L int) {
	const op = "ChannelScaleAddBackward"
	n := B * C * L
	dxs := f32n(op, "dx", dx, n)
	dws := f32n(op, "dw", dw, C)
	d := f32n(op, "dout", dout, n)
	xs := f32n(op, "x", x, n)
	ws := f32n(op, "w", w, C)
	b.pool.For(C, max(1, rowGrain(B*L)), func(lo, hi int) {
		for c := lo; c < hi; c++ {
			wc := ws[c]
			var s float64
			for bi := 0; bi < B; bi++ {
				r := (bi*C + c) * L
				di, xi, dxi := d[r:r+L], xs[r:r+L], dxs[r:r+L]
				xi, dxi = xi[:len(di)], dxi[:len(di)]
				for i, v := range di {
					dxi[i] += wc * v
					s += float64(v) * float64(xi[i])
				}
			}
			dws[c] += float32(s)
		}
	})
}
