package cpu

import (
	"math"

	"github.com/titan-go/titan/internal/backend"
)

// SinForward computes out[i,j] = sin(freq[j]·inp[i,j]) for N rows of C
// elements (the product rounded to float32, the sine taken in float64);
// out may alias inp.
func (b *Backend) SinForward(out, inp, freq backend.Tensor, N, C int) {
	const op = "SinForward"
	o := f32n(op, "out", out, N*C)
	x := f32n(op, "inp", inp, N*C)
	f := f32n(op, "freq", freq, C)
	b.pool.For(N, max(1, rowGrain(C)/8), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			xi := x[i*C : (i+1)*C]
			oi := o[i*C : (i+1)*C][:len(xi)]
			for j, v := range xi {
				oi[j] = float32(math.Sin(float64(f[j] * v)))
			}
		}
	})
}

// SinBackward accumulates dinp[i,j] += dout[i,j]·freq[j]·cos(freq[j]·inp[i,j])
// and dfreq[j] += Σ_i dout[i,j]·inp[i,j]·cos(freq[j]·inp[i,j]). The
// frequency gradient sums the rows in order, in float64, within column
// strips, so it does not depend on the thread count.
func (b *Backend) SinBackward(dinp, dfreq, dout, inp, freq backend.Tensor, N, C int) {
	const op = "SinBackward"
	dx := f32n(op, "dinp", dinp, N*C)
	df := f32n(op, "dfreq", dfreq, C)
	d := f32n(op, "dout", dout, N*C)
	x := f32n(op, "inp", inp, N*C)
	f := f32n(op, "freq", freq, C)
	strips := (C + colStrip - 1) / colStrip
	b.pool.For(strips, max(1, elemGrain/8/max(N*colStrip, 1)), func(lo, hi int) {
		for s := lo; s < hi; s++ {
			c0, c1 := s*colStrip, min((s+1)*colStrip, C)
			var acc [colStrip]float64
			fs := f[c0:c1]
			for i := 0; i < N; i++ {
				xi := x[i*C+c0 : i*C+c1][:len(fs)]
				di := d[i*C+c0 : i*C+c1][:len(fs)]
				dxi := dx[i*C+c0 : i*C+c1][:len(fs)]
				for j, v := range xi {
					cs := math.Cos(float64(fs[j] * v))
					g := float64(di[j]) * cs
					dxi[j] += float32(g * float64(fs[j]))
					acc[j] += g * float64(v)
				}
			}
			for j := range fs {
				df[c0+j] += float32(acc[j])
			}
		}
	})
}
