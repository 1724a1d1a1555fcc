package cpu

import (
	"math"

	"github.com/titan-go/titan/internal/backend"
)

// colStrip is the column width of the strips that column reductions
// (weight gradients) hand to workers: one cache line of float32.
const colStrip = 16

// RMSNormForward computes out[i,:] = inp[i,:] * rstd[i] * weight with
// rstd[i] = 1/sqrt(mean(inp[i,:]^2) + eps), saving rstd. out may alias inp.
func (b *Backend) RMSNormForward(out, rstd, inp, weight backend.Tensor, N, C int, eps float32) {
	const op = "RMSNormForward"
	o := f32n(op, "out", out, N*C)
	rs := f32n(op, "rstd", rstd, N)
	x := f32n(op, "inp", inp, N*C)
	w := f32n(op, "weight", weight, C)
	b.pool.For(N, rowGrain(C), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			xi := x[i*C : (i+1)*C]
			oi := o[i*C : (i+1)*C]
			ms := dot(xi, xi) / float32(C)
			r := float32(1 / math.Sqrt(float64(ms+eps)))
			rs[i] = r
			oi = oi[:len(xi)]
			wi := w[:len(xi)]
			for j, v := range xi {
				oi[j] = v * r * wi[j]
			}
		}
	})
}

// RMSNormBackward accumulates
//
//	dinp[i,j]  += rstd[i]*w[j]*dout[i,j] - inp[i,j]*rstd[i]^3/C * sum_k dout[i,k]*w[k]*inp[i,k]
//	dweight[j] += sum_i dout[i,j]*inp[i,j]*rstd[i]
//
// dweight sums rows in order (in float64) within column strips, so it does
// not depend on the thread count.
func (b *Backend) RMSNormBackward(dinp, dweight, dout, inp, weight, rstd backend.Tensor, N, C int) {
	const op = "RMSNormBackward"
	dx := f32n(op, "dinp", dinp, N*C)
	dw := f32n(op, "dweight", dweight, C)
	d := f32n(op, "dout", dout, N*C)
	x := f32n(op, "inp", inp, N*C)
	w := f32n(op, "weight", weight, C)
	rs := f32n(op, "rstd", rstd, N)
	b.pool.For(N, rowGrain(C), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			xi := x[i*C : (i+1)*C]
			di := d[i*C : (i+1)*C][:len(xi)]
			dxi := dx[i*C : (i+1)*C][:len(xi)]
			wi := w[:len(xi)]
			var s0, s1 float32
			j := 0
			for ; j+1 < len(xi); j += 2 {
				s0 += di[j] * wi[j] * xi[j]
				s1 += di[j+1] * wi[j+1] * xi[j+1]
			}
			if j < len(xi) {
				s0 += di[j] * wi[j] * xi[j]
			}
			r := rs[i]
			k := r * r * r * (s0 + s1) / float32(C)
			for j, v := range xi {
				dxi[j] += r*wi[j]*di[j] - k*v
			}
		}
	})
	strips := (C + colStrip - 1) / colStrip
	b.pool.For(strips, max(1, elemGrain/max(N*colStrip, 1)), func(lo, hi int) {
		for s := lo; s < hi; s++ {
			c0, c1 := s*colStrip, min((s+1)*colStrip, C)
			var acc [colStrip]float64
			a := acc[:c1-c0]
			for i := 0; i < N; i++ {
				r := float64(rs[i])
				xi := x[i*C+c0 : i*C+c1]
				di := d[i*C+c0 : i*C+c1][:len(xi)]
				a := a[:len(xi)]
				for j, v := range xi {
					a[j] += float64(di[j]) * float64(v) * r
				}
			}
			for j := range a {
				dw[c0+j] += float32(a[j])
			}
		}
	})
}
