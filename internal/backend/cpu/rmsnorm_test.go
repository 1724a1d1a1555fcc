package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/titan-go/titan/internal/backend"
)

// rmsNormData returns n values of the given kind: "unit" uniform in
// [-1, 1), "wide" with magnitudes from 2^-40 to 2^40 (so that the order
// of a sum shows in its bits), "special" wide values with ±0, subnormals,
// ±Inf, NaN and values whose squares overflow mixed in.
func rmsNormData(r *rand.Rand, n int, kind string) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch kind {
		case "unit":
			x[i] = float32(2*r.Float64() - 1)
		default:
			x[i] = float32((2*r.Float64() - 1) * math.Exp2(float64(r.IntN(81)-40)))
		}
	}
	if kind == "special" {
		small := []float32{0, float32(math.Copysign(0, -1)), 1e-40, -3e-45, 1e-38}
		huge := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1e30, -2e25}
		for i := range x {
			// One in eight zero or subnormal, one in 400 not finite or
			// with a square that overflows (most rows stay finite).
			switch k := r.IntN(400); {
			case k == 0:
				x[i] = huge[r.IntN(len(huge))]
			case k <= 50:
				x[i] = small[r.IntN(len(small))]
			}
		}
	}
	return x
}

// TestRMSNormVectorMatchesScalar: RMSNormForward and RMSNormBackward give
// exactly the scalar code's bits with the vector kernels, over row widths
// around the 16-lane blocks, the 8-column groups and the 128-column
// strips of the weight gradient.
func TestRMSNormVectorMatchesScalar(t *testing.T) {
	if !useRMSNormAVX512 {
		t.Skip("no vector RMSNorm on this machine")
	}
	r := newRand(21)
	type result struct{ out, rstd, dx, dw []float32 }
	run := func(b *Backend, x, w, d, dx0, dw0 []float32, N, C int, vec bool) result {
		saved := useRMSNormAVX512
		useRMSNormAVX512 = vec
		defer func() { useRMSNormAVX512 = saved }()
		xt, wt := upload(b, x), upload(b, w)
		out, rstd := b.Alloc(backend.Float32, N*C), b.Alloc(backend.Float32, N)
		b.RMSNormForward(out, rstd, xt, wt, N, C, 1e-5)
		dx, dw := upload(b, dx0), upload(b, dw0)
		b.RMSNormBackward(dx, dw, upload(b, d), xt, wt, rstd, N, C)
		return result{download(b, out), download(b, rstd), download(b, dx), download(b, dw)}
	}
	// Every width up to 137 (each count of 8-column groups in a strip,
	// with and without a tail), then widths around two and more strips.
	var widths []int
	for C := 0; C <= 137; C++ {
		widths = append(widths, C)
	}
	widths = append(widths, 255, 256, 257, 300, 1031)
	for _, C := range widths {
		for _, N := range []int{0, 1, 3, 17, 70} {
			for _, kind := range []string{"unit", "wide", "special"} {
				t.Run(fmt.Sprintf("N%d/C%d/%s", N, C, kind), func(t *testing.T) {
					b := newTestBackend(t, 1+N%3)
					x, w := rmsNormData(r, N*C, kind), rmsNormData(r, C, kind)
					d, dx0, dw0 := rmsNormData(r, N*C, kind), rmsNormData(r, N*C, "unit"), rmsNormData(r, C, "unit")
					vec := run(b, x, w, d, dx0, dw0, N, C, true)
					scal := run(b, x, w, d, dx0, dw0, N, C, false)
					sameBits(t, "out", vec.out, scal.out)
					sameBits(t, "rstd", vec.rstd, scal.rstd)
					sameBits(t, "dinp", vec.dx, scal.dx)
					sameBits(t, "dweight", vec.dw, scal.dw)
				})
			}
		}
	}
}
