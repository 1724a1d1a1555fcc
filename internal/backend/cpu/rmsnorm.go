package cpu

import (
	"math"

	"github.com/titan-go/titan/internal/backend"
)

// colStrip is the column width of the strips that column reductions
// (weight gradients) hand to workers: one cache line of float32.
const colStrip = 16

// rmsStrip is the widest of RMSNormBackward's weight-gradient strips:
// eight cache lines of float32 per row, whose float64 sums the vector
// kernel keeps in sixteen registers.
const rmsStrip = 128

// The scalar code below is the reference of the vector kernels: the
// conversions around products keep the compiler from fusing them with
// the following addition (the kernels do not fuse).

// rmsLanes is the number of lanes of RMSNorm's row sums: lane l adds the
// terms of the elements j ≡ l (mod rmsLanes) in order of j, and laneSum
// combines the lanes, the order of one 16-float32 vector register.
const rmsLanes = 16

// laneSum combines the lanes of acc by folding halves: lane l adds lane
// l+w for w = 8, 4, 2, 1, and returns lane 0.
func laneSum(acc *[rmsLanes]float32) float32 {
	for w := rmsLanes / 2; w >= 1; w /= 2 {
		for l := 0; l < w; l++ {
			acc[l] += acc[l+w]
		}
	}
	return acc[0]
}

// rmsSumSquares returns Σ x[j]² in the lane order of rmsLanes.
func rmsSumSquares(x []float32) float32 {
	if s, ok := rmsSumSquaresVec(x); ok {
		return s
	}
	var acc [rmsLanes]float32
	for j, v := range x {
		acc[j&(rmsLanes-1)] += float32(v * v)
	}
	return laneSum(&acc)
}

// rmsDot3 returns Σ (a[j]*b[j])*c[j] in the lane order of rmsLanes.
func rmsDot3(a, b, c []float32) float32 {
	b, c = b[:len(a)], c[:len(a)]
	if s, ok := rmsDot3Vec(a, b, c); ok {
		return s
	}
	var acc [rmsLanes]float32
	for j, v := range a {
		acc[j&(rmsLanes-1)] += float32(v * b[j] * c[j])
	}
	return laneSum(&acc)
}

// RMSNormForward computes out[i,:] = inp[i,:] * rstd[i] * weight with
// rstd[i] = 1/sqrt(mean(inp[i,:]^2) + eps), saving rstd. out may alias inp.
// The sum of squares runs in the lane order of rmsLanes, rstd is rounded
// from float64, and each output is (inp*rstd)*weight; a bfloat16 out
// holds each output rounded to nearest even.
func (b *Backend) RMSNormForward(out, rstd, inp, weight backend.Tensor, N, C int, eps float32) {
	const op = "RMSNormForward"
	o := outF32OrBF16(op, out, N*C)
	rs := f32n(op, "rstd", rstd, N)
	x := f32n(op, "inp", inp, N*C)
	w := f32n(op, "weight", weight, C)
	b.pool.For(N, rowGrain(C), func(lo, hi int) {
		var buf [bf16Run]float32
		for i := lo; i < hi; i++ {
			xi := x[i*C : (i+1)*C]
			wi := w[:len(xi)]
			ms := rmsSumSquares(xi) / float32(C)
			r := float32(1 / math.Sqrt(float64(ms+eps)))
			rs[i] = r
			o.each(i*C, len(xi), buf[:], func(dst []float32, j int) {
				x, w := xi[j:j+len(dst)], wi[j:j+len(dst)]
				for k := rmsScaleBlocks(dst, x, w, r); k < len(dst); k++ {
					dst[k] = x[k] * r * w[k]
				}
			})
		}
	})
}

// RMSNormBackward accumulates
//
//	dinp[i,j]  += rstd[i]*w[j]*dout[i,j] - inp[i,j]*rstd[i]^3/C * sum_k dout[i,k]*w[k]*inp[i,k]
//	dweight[j] += sum_i dout[i,j]*inp[i,j]*rstd[i]
//
// The row sum runs in the lane order of rmsLanes and each dinp term is
// (rstd*w)*dout - k*inp. dweight sums rows in order (in float64) within
// column strips, so it does not depend on the thread count.
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
			r := rs[i]
			k := r * r * r * rmsDot3(di, wi, xi) / float32(C)
			for j := rmsBackRowBlocks(dxi, di, xi, wi, r, k); j < len(xi); j++ {
				dxi[j] += float32(r*wi[j]*di[j]) - float32(k*xi[j])
			}
		}
	})
	// Strips of rmsStrip columns, narrower (a multiple of eight) where
	// that leaves workers idle; each column's sum is the same whatever
	// the strip.
	sw := min(rmsStrip, max(8, C/b.pool.Size()&^7))
	strips := (C + sw - 1) / sw
	b.pool.For(strips, max(1, elemGrain/max(N*sw, 1)), func(lo, hi int) {
		for s := lo; s < hi; s++ {
			c0, c1 := s*sw, min((s+1)*sw, C)
			var acc [rmsStrip]float64
			j0 := rmsDweightBlocks(&acc, d, x, rs, N, C, c0, c1)
			a := acc[j0 : c1-c0]
			for i := 0; i < N && len(a) > 0; i++ {
				r := float64(rs[i])
				xi := x[i*C+c0+j0 : i*C+c1]
				di := d[i*C+c0+j0 : i*C+c1][:len(xi)]
				a := a[:len(xi)]
				for j, v := range xi {
					a[j] += float64(float64(di[j]) * float64(v) * r)
				}
			}
			for j, v := range acc[:c1-c0] {
				dw[c0+j] += float32(v)
			}
		}
	})
}
