package cpu

import (
	"fmt"
	"math"

	"github.com/titan-go/titan/internal/backend"
)

// elemGrain is the smallest number of elements worth handing to a worker
// in a memory-bound elementwise loop.
const elemGrain = 1 << 15

// sumSquaresBlock is the number of elements per partial sum of
// SumSquares. The partials are added in block order, so the result does
// not depend on the thread count.
const sumSquaresBlock = 1 << 14

// Add computes out = a + b elementwise; out may alias a or b.
func (b *Backend) Add(out, x, y backend.Tensor) {
	const op = "Add"
	n := out.Len
	if x.Len != n || y.Len != n {
		panic(fmt.Sprintf("cpu: Add: lengths differ (out %d, a %d, b %d)", n, x.Len, y.Len))
	}
	o, xs, ys := f32(op, "out", out), f32(op, "a", x), f32(op, "b", y)
	b.pool.For(n, elemGrain, func(lo, hi int) {
		o, xs, ys := o[lo:hi], xs[lo:hi], ys[lo:hi]
		ys = ys[:len(o)]
		xs = xs[:len(o)]
		for i := range o {
			o[i] = xs[i] + ys[i]
		}
	})
}

// Axpy computes y += alpha*x.
func (b *Backend) Axpy(y backend.Tensor, alpha float32, x backend.Tensor) {
	const op = "Axpy"
	if x.Len != y.Len {
		panic(fmt.Sprintf("cpu: Axpy: lengths differ (y %d, x %d)", y.Len, x.Len))
	}
	ys, xs := f32(op, "y", y), f32(op, "x", x)
	b.pool.For(len(ys), elemGrain, func(lo, hi int) {
		axpy(ys[lo:hi], alpha, xs[lo:hi])
	})
}

// Scale computes x *= alpha.
func (b *Backend) Scale(x backend.Tensor, alpha float32) {
	xs := f32("Scale", "x", x)
	b.pool.For(len(xs), elemGrain, func(lo, hi int) {
		scale(xs[lo:hi], alpha)
	})
}

// SumSquares returns the sum of x[i]^2, accumulated in float64. Blocks of
// sumSquaresBlock elements are summed in parallel and the block sums added
// in order, so the result is independent of the thread count.
func (b *Backend) SumSquares(x backend.Tensor) float64 {
	xs := f32("SumSquares", "x", x)
	nb := (len(xs) + sumSquaresBlock - 1) / sumSquaresBlock
	if nb <= 1 {
		return sumSquares(xs)
	}
	part := make([]float64, nb)
	b.pool.For(nb, 1, func(lo, hi int) {
		for k := lo; k < hi; k++ {
			end := min((k+1)*sumSquaresBlock, len(xs))
			part[k] = sumSquares(xs[k*sumSquaresBlock : end])
		}
	})
	var s float64
	for _, p := range part {
		s += p
	}
	return s
}

// sumSquares returns the float64 sum of squares of x in a fixed order.
func sumSquares(x []float32) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+3 < len(x); i += 4 {
		a, b, c, d := float64(x[i]), float64(x[i+1]), float64(x[i+2]), float64(x[i+3])
		s0 += a * a
		s1 += b * b
		s2 += c * c
		s3 += d * d
	}
	for ; i < len(x); i++ {
		a := float64(x[i])
		s0 += a * a
	}
	return (s0 + s1) + (s2 + s3)
}

// axpy computes y += alpha*x over len(y) elements.
func axpy(y []float32, alpha float32, x []float32) {
	x = x[:len(y)]
	i := 0
	for ; i+3 < len(y); i += 4 {
		y[i] += alpha * x[i]
		y[i+1] += alpha * x[i+1]
		y[i+2] += alpha * x[i+2]
		y[i+3] += alpha * x[i+3]
	}
	for ; i < len(y); i++ {
		y[i] += alpha * x[i]
	}
}

// scale computes x *= alpha.
func scale(x []float32, alpha float32) {
	i := 0
	for ; i+3 < len(x); i += 4 {
		x[i] *= alpha
		x[i+1] *= alpha
		x[i+2] *= alpha
		x[i+3] *= alpha
	}
	for ; i < len(x); i++ {
		x[i] *= alpha
	}
}

// dot returns the sum of x[i]*y[i] over len(x) elements with four
// accumulators combined in a fixed order.
func dot(x, y []float32) float32 {
	y = y[:len(x)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+3 < len(x); i += 4 {
		s0 += x[i] * y[i]
		s1 += x[i+1] * y[i+1]
		s2 += x[i+2] * y[i+2]
		s3 += x[i+3] * y[i+3]
	}
	for ; i < len(x); i++ {
		s0 += x[i] * y[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// rowMax returns the largest element of x (-Inf for an empty x). NaNs
// may or may not be ignored.
func rowMax(x []float32) float32 {
	m0, i := maxBlocks(x)
	m1 := float32(math.Inf(-1))
	for ; i+1 < len(x); i += 2 {
		if x[i] > m0 {
			m0 = x[i]
		}
		if x[i+1] > m1 {
			m1 = x[i+1]
		}
	}
	if i < len(x) && x[i] > m0 {
		m0 = x[i]
	}
	if m1 > m0 {
		return m1
	}
	return m0
}
