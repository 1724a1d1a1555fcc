package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/titan-go/titan/internal/backend"
)

// wideF32 returns n values of random sign and magnitude 2^e·m with e
// uniform in [-lo, hi) and m in [1, 2), with every tenth or so replaced by
// one of specials.
func wideF32(r *rand.Rand, n int, lo, hi float64, specials []float32) []float32 {
	x := make([]float32, n)
	for i := range x {
		v := float32(math.Exp2(-lo+(hi+lo)*r.Float64()) * (1 + r.Float64()))
		if r.IntN(2) == 0 {
			v = -v
		}
		if len(specials) > 0 && r.IntN(10) == 0 {
			v = specials[r.IntN(len(specials))]
		}
		x[i] = v
	}
	return x
}

// sameBits reports whether a and b are bitwise equal, NaNs matching any
// NaN, and names the first difference.
func sameBits(t *testing.T, name string, got, want []float32) {
	t.Helper()
	for i := range want {
		g, w := got[i], want[i]
		if math.Float32bits(g) != math.Float32bits(w) && !(g != g && w != w) {
			t.Fatalf("%s[%d] = %v (%#08x), scalar %v (%#08x)", name, i, g, math.Float32bits(g), w, math.Float32bits(w))
		}
	}
}

// withSwitch runs f with *sw set to on and restores it.
func withSwitch(sw *bool, on bool, f func()) {
	saved := *sw
	*sw = on
	defer func() { *sw = saved }()
	f()
}

var vecSpecials = []float32{
	0, float32(math.Copysign(0, -1)), 1e-45, -1e-45, 1e-40, -3e-39,
	float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
	math.MaxFloat32, -math.MaxFloat32, 1, -1,
}

// TestSwiGLUVectorMatchesScalar checks the fused kernels against the
// scalar code bit for bit, with gates in and beyond the sigmoid's fast
// range (below -88 the kernels stop and the scalar code takes over).
func TestSwiGLUVectorMatchesScalar(t *testing.T) {
	gateSpecials := append([]float32{-88, -88.5, -89, -100, 88, 89, -87.9}, vecSpecials...)
	for _, n := range []int{0, 1, 7, 8, 15, 16, 17, 31, 255, 256, 257, 1000, 4099, 70001} {
		for _, wide := range []bool{false, true} {
			r := newRand(uint64(n) + 11)
			var g, u, d []float32
			if wide {
				g = wideF32(r, n, 20, 8, gateSpecials)
				u, d = wideF32(r, n, 30, 30, vecSpecials), wideF32(r, n, 30, 30, vecSpecials)
			} else {
				g, u, d = randF32(r, n, 12), randF32(r, n, 2), randF32(r, n, 1)
			}
			dg0, du0 := randF32(r, n, 1), randF32(r, n, 1)
			run := func(vec bool) (out, dg, du []float32) {
				b := newTestBackend(t, 2)
				gt, ut, dt := upload(b, g), upload(b, u), upload(b, d)
				o := b.Alloc(backend.Float32, n)
				dgt, dut := upload(b, dg0), upload(b, du0)
				// The scalar reference takes its sigmoid from the scalar
				// expf too, not from sigmoidAVX2.
				withSwitch(&useAVX2, vec && useAVX2, func() {
					withSwitch(&useSwiGLUAVX512, vec, func() {
						b.SwiGLUForward(o, gt, ut, n)
						b.SwiGLUBackward(dgt, dut, dt, gt, ut, n)
					})
				})
				return download(b, o), download(b, dgt), download(b, dut)
			}
			so, sdg, sdu := run(false)
			vo, vdg, vdu := run(true)
			sameBits(t, "out", vo, so)
			sameBits(t, "dgate", vdg, sdg)
			sameBits(t, "dup", vdu, sdu)
		}
	}
}

// TestRoPEVectorMatchesScalar checks the vector rotations against the
// scalar code bit for bit over head sizes with and without a partial
// block of eight pairs, in place and not.
func TestRoPEVectorMatchesScalar(t *testing.T) {
	for _, sh := range []struct{ B, T, NH, HD int }{
		{1, 1, 1, 2}, {1, 3, 2, 4}, {2, 3, 3, 14}, {1, 2, 1, 16}, {2, 5, 2, 18},
		{1, 4, 3, 30}, {3, 2, 2, 32}, {1, 3, 5, 34}, {2, 7, 4, 64}, {1, 3, 2, 130},
		{2, 4, 0, 8}, {0, 4, 2, 8}, {2, 3, 2, 0},
	} {
		for _, inPlace := range []bool{false, true} {
			r := newRand(uint64(sh.HD*100 + sh.NH))
			n, half := sh.B*sh.T*sh.NH*sh.HD, sh.HD/2
			x, d := wideF32(r, n, 30, 30, vecSpecials), wideF32(r, n, 30, 30, vecSpecials)
			cs, sn := wideF32(r, sh.T*half, 10, 1, vecSpecials), wideF32(r, sh.T*half, 10, 1, vecSpecials)
			dx0 := randF32(r, n, 1)
			run := func(vec bool) (out, dx []float32) {
				b := newTestBackend(t, 2)
				xt, dt, ct, st := upload(b, x), upload(b, d), upload(b, cs), upload(b, sn)
				o := xt
				if !inPlace {
					o = b.Alloc(backend.Float32, n)
				}
				dxt := upload(b, dx0)
				withSwitch(&useRoPEAVX512, vec, func() {
					b.RoPEForward(o, xt, ct, st, sh.B, sh.T, sh.NH, sh.HD)
					b.RoPEBackward(dxt, dt, ct, st, sh.B, sh.T, sh.NH, sh.HD)
				})
				return download(b, o), download(b, dxt)
			}
			so, sdx := run(false)
			vo, vdx := run(true)
			sameBits(t, "out", vo, so)
			sameBits(t, "dinp", vdx, sdx)
		}
	}
}

// TestSwiGLUKernelCoverage checks, where the machine runs the fused
// kernels, that they take every element of in-range gates (so the bitwise
// test above exercises them) and stop at the block of the first gate they
// cannot take.
func TestSwiGLUKernelCoverage(t *testing.T) {
	if !useSwiGLUAVX512 {
		t.Skip("no AVX-512")
	}
	r := newRand(12)
	for _, n := range []int{1, 16, 37, 256} {
		g, u, d := randF32(r, n, 80), randF32(r, n, 1), randF32(r, n, 1)
		o, dg, du := make([]float32, n), make([]float32, n), make([]float32, n)
		if k := swigluFwdBlocks(o, g, u); k != n {
			t.Errorf("n=%d: forward kernel did %d elements", n, k)
		}
		if k := swigluBwdBlocks(dg, du, d, g, u); k != n {
			t.Errorf("n=%d: backward kernel did %d elements", n, k)
		}
		for _, bad := range []float32{-89, float32(math.NaN()), float32(math.Inf(-1))} {
			j := n - 1
			g[j] = bad
			want := j &^ (swigluLanes - 1)
			if k := swigluFwdBlocks(o, g, u); k != want {
				t.Errorf("n=%d gate[%d]=%v: forward kernel did %d elements, want %d", n, j, bad, k, want)
			}
			if k := swigluBwdBlocks(dg, du, d, g, u); k != want {
				t.Errorf("n=%d gate[%d]=%v: backward kernel did %d elements, want %d", n, j, bad, k, want)
			}
			g[j] = 0
		}
	}
}
