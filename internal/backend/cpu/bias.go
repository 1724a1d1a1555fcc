package cpu

import "github.com/titan-go/titan/internal/backend"

// BroadcastRows sets out[i,:] = row for the N rows of out [N, C].
func (b *Backend) BroadcastRows(out, row backend.Tensor, N, C int) {
	const op = "BroadcastRows"
	o := f32n(op, "out", out, N*C)
	r := f32n(op, "row", row, C)
	b.pool.For(N, rowGrain(C), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			copy(o[i*C:(i+1)*C], r)
		}
	})
}

// SumRows accumulates dst[j] += Σ_i src[i,j] over the N rows of src
// [N, C]. Each column strip sums its rows in order, in float64, so the
// result does not depend on the thread count.
func (b *Backend) SumRows(dst, src backend.Tensor, N, C int) {
	const op = "SumRows"
	d := f32n(op, "dst", dst, C)
	s := f32n(op, "src", src, N*C)
	strips := (C + colStrip - 1) / colStrip
	b.pool.For(strips, max(1, elemGrain/max(N*colStrip, 1)), func(lo, hi int) {
		for st := lo; st < hi; st++ {
			c0, c1 := st*colStrip, min((st+1)*colStrip, C)
			var acc [colStrip]float64
			a := acc[:c1-c0]
			for i := 0; i < N; i++ {
				si := s[i*C+c0 : i*C+c1][:len(a)]
				for j, v := range si {
					a[j] += float64(v)
				}
			}
			for j, v := range a {
				d[c0+j] += float32(v)
			}
		}
	})
}
