package cpu

import "github.com/titan-go/titan/internal/backend"

// SwiGLUForward computes out = silu(gate) * up over n elements, where
// silu(x) = x * sigmoid(x). out may alias gate or up.
func (b *Backend) SwiGLUForward(out, gate, up backend.Tensor, n int) {
	const op = "SwiGLUForward"
	o := f32n(op, "out", out, n)
	g := f32n(op, "gate", gate, n)
	u := f32n(op, "up", up, n)
	b.pool.For(n, elemGrain/4, func(lo, hi int) {
		g := g[lo:hi]
		o := o[lo:hi][:len(g)]
		u := u[lo:hi][:len(g)]
		var sig [expBlock]float32
		for k := 0; k < len(g); k += expBlock {
			n := min(expBlock, len(g)-k)
			sigmoid(sig[:n], g[k:k+n])
			s := sig[:n]
			for i, x := range g[k : k+n][:len(s)] {
				o[k+i] = x * s[i] * u[k+i]
			}
		}
	})
}

// SwiGLUBackward accumulates
//
//	dgate += dout * up * sigmoid(gate) * (1 + gate*(1 - sigmoid(gate)))
//	dup   += dout * silu(gate)
func (b *Backend) SwiGLUBackward(dgate, dup, dout, gate, up backend.Tensor, n int) {
	const op = "SwiGLUBackward"
	dg := f32n(op, "dgate", dgate, n)
	du := f32n(op, "dup", dup, n)
	d := f32n(op, "dout", dout, n)
	g := f32n(op, "gate", gate, n)
	u := f32n(op, "up", up, n)
	b.pool.For(n, elemGrain/4, func(lo, hi int) {
		g := g[lo:hi]
		dg := dg[lo:hi][:len(g)]
		du := du[lo:hi][:len(g)]
		d := d[lo:hi][:len(g)]
		u := u[lo:hi][:len(g)]
		var sig [expBlock]float32
		for k := 0; k < len(g); k += expBlock {
			n := min(expBlock, len(g)-k)
			sigmoid(sig[:n], g[k:k+n])
			s := sig[:n]
			x, d, u := g[k : k+n][:len(s)], d[k : k+n][:len(s)], u[k : k+n][:len(s)]
			dg, du := dg[k : k+n][:len(s)], du[k : k+n][:len(s)]
			for i, si := range s {
				di := d[i]
				dg[i] += di * u[i] * si * (1 + x[i]*(1-si))
				du[i] += di * x[i] * si
			}
		}
	})
}
