package cpu

import "github.com/titan-go/titan/internal/backend"

// SwiGLUForward computes out = silu(gate) * up over n elements, where
// silu(x) = x * sigmoid(x), as (x*sigmoid(x))*up. out may alias gate or
// up; a bfloat16 out holds each result rounded to nearest even.
func (b *Backend) SwiGLUForward(out, gate, up backend.Tensor, n int) {
	const op = "SwiGLUForward"
	o := outF32OrBF16(op, out, n)
	g := f32n(op, "gate", gate, n)
	u := f32n(op, "up", up, n)
	b.pool.For(n, elemGrain/4, func(lo, hi int) {
		var buf [bf16Run]float32
		o.each(lo, hi-lo, buf[:], func(o []float32, j int) {
			g, u := g[lo+j:lo+j+len(o)], u[lo+j:lo+j+len(o)]
			for i := 0; i < len(g); {
				i += swigluFwdBlocks(o[i:], g[i:], u[i:])
				k := min(len(g)-i, swigluRun())
				swigluFwdGo(o[i:i+k], g[i:i+k], u[i:i+k])
				i += k
			}
		})
	})
}

// swigluRun is the number of elements the scalar code takes after the
// vector kernel stops: the kernel's block when it runs (it stops at a
// block it cannot take, see swigluFwdAVX512), else a sigmoid buffer.
func swigluRun() int {
	if useSwiGLUAVX512 {
		return swigluLanes
	}
	return expBlock
}

// swigluFwdGo is SwiGLUForward's scalar code for len(g) <= expBlock
// elements: o[i] = (x*s)*u[i] with x = g[i] and s = sigmoid(x).
func swigluFwdGo(o, g, u []float32) {
	var sig [expBlock]float32
	s := sig[:len(g)]
	sigmoid(s, g)
	o, u = o[:len(s)], u[:len(s)]
	for i, x := range g[:len(s)] {
		o[i] = x * s[i] * u[i]
	}
}

// SwiGLUBackward accumulates
//
//	dgate += dout * up * sigmoid(gate) * (1 + gate*(1 - sigmoid(gate)))
//	dup   += dout * gate * sigmoid(gate)
//
// each product taken left to right.
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
		for i := 0; i < len(g); {
			i += swigluBwdBlocks(dg[i:], du[i:], d[i:], g[i:], u[i:])
			k := min(len(g)-i, swigluRun())
			swigluBwdGo(dg[i:i+k], du[i:i+k], d[i:i+k], g[i:i+k], u[i:i+k])
			i += k
		}
	})
}

// swigluBwdGo is SwiGLUBackward's scalar code for len(g) <= expBlock
// elements. The float32 conversions keep the compiler from fusing a
// product into the following addition (GOAMD64=v3 would), so that the
// vector kernel's separate multiplies and adds give the same bits.
func swigluBwdGo(dg, du, d, g, u []float32) {
	var sig [expBlock]float32
	s := sig[:len(g)]
	sigmoid(s, g)
	x, d, u := g[:len(s)], d[:len(s)], u[:len(s)]
	dg, du = dg[:len(s)], du[:len(s)]
	for i, si := range s {
		di := d[i]
		dg[i] += float32(di * u[i] * si * (1 + float32(x[i]*(1-si))))
		du[i] += float32(di * x[i] * si)
	}
}
