package longconv

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x6c6f6e67)) }

// randF32 returns n values uniform in [-1, 1).
func randF32(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(2*r.Float64() - 1)
	}
	return x
}

// decayingFilter returns C filters of length L, h[c][k] ~ U(-1,1)·e^{-k/τ}.
func decayingFilter(r *rand.Rand, C, L int, tau float64) []float32 {
	h := make([]float32, C*L)
	for c := range C {
		for k := range L {
			h[c*L+k] = float32((2*r.Float64() - 1) * math.Exp(-float64(k)/tau))
		}
	}
	return h
}

// refForward is the float64 direct causal convolution and, per output,
// the scale Σ|h||x| of its terms.
func refForward(x, h []float32, B, C, L int) (y, scale []float64) {
	y = make([]float64, B*C*L)
	scale = make([]float64, B*C*L)
	for b := range B {
		for c := range C {
			r := b*C + c
			for t := range L {
				var s, a float64
				for j := 0; j <= t; j++ {
					p := float64(h[c*L+t-j]) * float64(x[r*L+j])
					s += p
					a += math.Abs(p)
				}
				y[r*L+t], scale[r*L+t] = s, a
			}
		}
	}
	return y, scale
}

// maxNormErr is max |got-want| / (scale + tiny) over all elements.
func maxNormErr(got []float32, want, scale []float64) float64 {
	var e float64
	for i := range want {
		if d := math.Abs(float64(got[i])-want[i]) / (scale[i] + 1e-30); d > e {
			e = d
		}
	}
	return e
}

// tolFor is the normalized error bound c·ε·log₂L used by the tests.
func tolFor(L int) float64 {
	return 4 * 0x1p-24 * math.Max(1, math.Log2(float64(L)))
}

var convLengths = []int{1, 2, 3, 7, 8, 100, 300, 1000, 4096}

func TestForwardMatchesDirectSum(t *testing.T) {
	r := newRand(1)
	for _, L := range convLengths {
		for _, path := range []struct {
			name string
			cv   Conv
		}{{"direct", Conv{DirectMax: 1 << 30}}, {"fft", Conv{DirectMax: -1}}, {"auto", Conv{}}} {
			if path.name == "direct" && L > 1000 {
				continue
			}
			B, C := 2, 3
			t.Run(fmt.Sprintf("L=%d/%s", L, path.name), func(t *testing.T) {
				x := randF32(r, B*C*L)
				h := decayingFilter(r, C, L, float64(L)/3+1)
				y := make([]float32, B*C*L)
				for i := range y {
					y[i] = 99 // overwritten
				}
				path.cv.Forward(y, x, h, B, C, L)
				want, scale := refForward(x, h, B, C, L)
				e := maxNormErr(y, want, scale)
				t.Logf("normalized error %.3g (bound %.3g)", e, tolFor(L))
				if e > tolFor(L) {
					t.Fatalf("normalized error %.3g > %.3g", e, tolFor(L))
				}
			})
		}
	}
}

// TestForwardThreadsDeterministic checks that results do not depend on
// the number of goroutines, including the split of batch rows when there
// are fewer channels than threads.
func TestForwardThreadsDeterministic(t *testing.T) {
	r := newRand(2)
	B, C, L := 5, 2, 700
	x := randF32(r, B*C*L)
	h := decayingFilter(r, C, L, 200)
	y1 := make([]float32, B*C*L)
	y8 := make([]float32, B*C*L)
	Conv{Threads: 1}.Forward(y1, x, h, B, C, L)
	Conv{Threads: 8}.Forward(y8, x, h, B, C, L)
	for i := range y1 {
		if y1[i] != y8[i] {
			t.Fatalf("y[%d]: %v with 1 thread, %v with 8", i, y1[i], y8[i])
		}
	}
}

// loss is Σ w·Forward(x, h) in float64.
func loss(cv Conv, w, x, h []float32, B, C, L int) float64 {
	y := make([]float32, B*C*L)
	cv.Forward(y, x, h, B, C, L)
	var s float64
	for i := range y {
		s += float64(w[i]) * float64(y[i])
	}
	return s
}

// TestBackwardFiniteDifference compares the directional derivatives
// <dx, u> and <dh, v> of the loss Σ w·y with central differences. The
// loss is linear in x and in h, so a large step is exact up to rounding.
func TestBackwardFiniteDifference(t *testing.T) {
	r := newRand(3)
	for _, L := range []int{1, 2, 3, 7, 8, 100, 300, 1000} {
		for _, path := range []struct {
			name string
			cv   Conv
		}{{"direct", Conv{DirectMax: 1 << 30}}, {"fft", Conv{DirectMax: -1}}} {
			B, C := 2, 3
			t.Run(fmt.Sprintf("L=%d/%s", L, path.name), func(t *testing.T) {
				cv := path.cv
				x := randF32(r, B*C*L)
				h := decayingFilter(r, C, L, float64(L)/3+1)
				w := randF32(r, B*C*L)
				u := randF32(r, B*C*L)
				v := randF32(r, C*L)
				// Start from non-zero gradients: Backward accumulates.
				dx0, dh0 := randF32(r, B*C*L), randF32(r, C*L)
				dx := append([]float32(nil), dx0...)
				dh := append([]float32(nil), dh0...)
				cv.Backward(dx, dh, w, x, h, B, C, L)
				var gx, gh, sx, sh float64
				for i := range dx {
					gx += float64(dx[i]-dx0[i]) * float64(u[i])
					sx += math.Abs(float64(dx[i]-dx0[i]) * float64(u[i]))
				}
				for i := range dh {
					gh += float64(dh[i]-dh0[i]) * float64(v[i])
					sh += math.Abs(float64(dh[i]-dh0[i]) * float64(v[i]))
				}
				const e = 0.5
				xp, xm := shifted(x, u, e), shifted(x, u, -e)
				hp, hm := shifted(h, v, e), shifted(h, v, -e)
				fx := (loss(cv, w, xp, h, B, C, L) - loss(cv, w, xm, h, B, C, L)) / (2 * e)
				fh := (loss(cv, w, x, hp, B, C, L) - loss(cv, w, x, hm, B, C, L)) / (2 * e)
				tol := 1e-4 * math.Sqrt(float64(L))
				if d := math.Abs(fx - gx); d > tol*(sx+1e-3) {
					t.Errorf("<dx,u> = %.8g, finite difference %.8g", gx, fx)
				}
				if d := math.Abs(fh - gh); d > tol*(sh+1e-3) {
					t.Errorf("<dh,v> = %.8g, finite difference %.8g", gh, fh)
				}
			})
		}
	}
}

func shifted(x, u []float32, e float32) []float32 {
	y := make([]float32, len(x))
	for i := range x {
		y[i] = x[i] + e*u[i]
	}
	return y
}

// TestBackwardMatchesDirectSum checks both gradients elementwise against
// float64 sums, and that nil gradients are skipped.
func TestBackwardMatchesDirectSum(t *testing.T) {
	r := newRand(4)
	for _, L := range convLengths {
		B, C := 3, 2
		t.Run(fmt.Sprint(L), func(t *testing.T) {
			x := randF32(r, B*C*L)
			h := decayingFilter(r, C, L, float64(L)/3+1)
			dy := randF32(r, B*C*L)
			wantDX := make([]float64, B*C*L)
			sDX := make([]float64, B*C*L)
			wantDH := make([]float64, C*L)
			sDH := make([]float64, C*L)
			for b := range B {
				for c := range C {
					o := (b*C + c) * L
					for s := range L {
						for tt := s; tt < L; tt++ {
							p := float64(h[c*L+tt-s]) * float64(dy[o+tt])
							wantDX[o+s] += p
							sDX[o+s] += math.Abs(p)
							q := float64(dy[o+tt]) * float64(x[o+tt-s])
							wantDH[c*L+s] += q
							sDH[c*L+s] += math.Abs(q)
						}
					}
				}
			}
			dx := make([]float32, B*C*L)
			dh := make([]float32, C*L)
			Backward(dx, dh, dy, x, h, B, C, L)
			if e := maxNormErr(dx, wantDX, sDX); e > tolFor(L) {
				t.Errorf("dx: normalized error %.3g", e)
			}
			if e := maxNormErr(dh, wantDH, sDH); e > tolFor(L) {
				t.Errorf("dh: normalized error %.3g", e)
			}
			dx2 := make([]float32, B*C*L)
			Backward(dx2, nil, dy, x, h, B, C, L)
			for i := range dx {
				if dx[i] != dx2[i] {
					t.Fatalf("dx without dh differs at %d", i)
				}
			}
		})
	}
}

func TestForwardPanicsOnShortSlices(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic for a short y")
		}
	}()
	Forward(make([]float32, 5), make([]float32, 6), make([]float32, 3), 2, 1, 3)
}

// BenchmarkConvCrossover times one row of Forward by the direct sum and by
// the FFT (B=8 rows per channel, the filter transform amortised) to set
// DefaultDirectMax.
func BenchmarkConvCrossover(b *testing.B) {
	for _, L := range []int{32, 48, 64, 96, 128, 192, 256} {
		r := newRand(5)
		B, C := 8, 1
		x := randF32(r, B*C*L)
		h := decayingFilter(r, C, L, 50)
		y := make([]float32, B*C*L)
		for _, path := range []struct {
			name string
			cv   Conv
		}{{"direct", Conv{Threads: 1, DirectMax: 1 << 30}}, {"fft", Conv{Threads: 1, DirectMax: -1}}} {
			b.Run(fmt.Sprintf("L=%d/%s", L, path.name), func(b *testing.B) {
				for b.Loop() {
					path.cv.Forward(y, x, h, B, C, L)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(B), "ns/row")
			})
		}
	}
}
