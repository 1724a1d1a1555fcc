package cpu

import (
	"math"

	"github.com/titan-go/titan/internal/backend"
)

// LayerNormForward computes out[i,:] = (inp[i,:] - mean[i]) * rstd[i] *
// weight + bias with the row's mean and rstd[i] = 1/sqrt(var + eps) (the
// biased variance), both accumulated in float64 and saved. out may alias
// inp.
func (b *Backend) LayerNormForward(out, mean, rstd, inp, weight, bias backend.Tensor, N, C int, eps float32) {
	const op = "LayerNormForward"
	o := f32n(op, "out", out, N*C)
	mu := f32n(op, "mean", mean, N)
	rs := f32n(op, "rstd", rstd, N)
	x := f32n(op, "inp", inp, N*C)
	w := f32n(op, "weight", weight, C)
	bs := f32n(op, "bias", bias, C)
	b.pool.For(N, rowGrain(C), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			xi := x[i*C : (i+1)*C]
			var s float64
			for _, v := range xi {
				s += float64(v)
			}
			m := s / float64(C)
			var ss float64
			for _, v := range xi {
				d := float64(v) - m
				ss += d * d
			}
			r := 1 / math.Sqrt(ss/float64(C)+float64(eps))
			mf, rf := float32(m), float32(r)
			mu[i], rs[i] = mf, rf
			oi := o[i*C : (i+1)*C][:len(xi)]
			wi, bi := w[:len(xi)], bs[:len(xi)]
			for j, v := range xi {
				oi[j] = (v-mf)*rf*wi[j] + bi[j]
			}
		}
	})
}

// LayerNormBackward accumulates, with x̂ = (inp - mean)·rstd and
// g = dout·weight,
//
//	dinp[i,j]  += rstd[i]·(g[i,j] - mean_j(g[i,:]) - x̂[i,j]·mean_j(g[i,:]·x̂[i,:]))
//	dweight[j] += Σ_i dout[i,j]·x̂[i,j]
//	dbias[j]   += Σ_i dout[i,j]
//
// The column sums run over rows in order (in float64) within column
// strips, so they do not depend on the thread count.
func (b *Backend) LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd backend.Tensor, N, C int) {
	const op = "LayerNormBackward"
	dx := f32n(op, "dinp", dinp, N*C)
	dw := f32n(op, "dweight", dweight, C)
	db := f32n(op, "dbias", dbias, C)
	d := f32n(op, "dout", dout, N*C)
	x := f32n(op, "inp", inp, N*C)
	w := f32n(op, "weight", weight, C)
	mu := f32n(op, "mean", mean, N)
	rs := f32n(op, "rstd", rstd, N)
	b.pool.For(N, rowGrain(C), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			xi := x[i*C : (i+1)*C]
			di := d[i*C : (i+1)*C][:len(xi)]
			dxi := dx[i*C : (i+1)*C][:len(xi)]
			wi := w[:len(xi)]
			m, r := mu[i], rs[i]
			var sg, sgx float64
			for j, v := range xi {
				g := float64(di[j] * wi[j])
				sg += g
				sgx += g * float64((v-m)*r)
			}
			mg, mgx := float32(sg/float64(C)), float32(sgx/float64(C))
			for j, v := range xi {
				xh := (v - m) * r
				dxi[j] += r * (di[j]*wi[j] - mg - xh*mgx)
			}
		}
	})
	strips := (C + colStrip - 1) / colStrip
	b.pool.For(strips, max(1, elemGrain/max(N*colStrip, 1)), func(lo, hi int) {
		for s := lo; s < hi; s++ {
			c0, c1 := s*colStrip, min((s+1)*colStrip, C)
			var aw, ab [colStrip]float64
			for i := 0; i < N; i++ {
				m, r := mu[i], rs[i]
				xi := x[i*C+c0 : i*C+c1]
				di := d[i*C+c0 : i*C+c1][:len(xi)]
				for j, v := range xi {
					aw[j] += float64(di[j]) * float64((v-m)*r)
					ab[j] += float64(di[j])
				}
			}
			for j := 0; j < c1-c0; j++ {
				dw[c0+j] += float32(aw[j])
				db[c0+j] += float32(ab[j])
			}
		}
	})
}
