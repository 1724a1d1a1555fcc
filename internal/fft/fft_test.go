package fft

import (
	"fmt"
	"math"
	"math/cmplx"
	"math/rand/v2"
	"testing"
)

// naiveDFT is the O(n²) half spectrum of x in float64.
func naiveDFT(x []float64) []complex128 {
	n := len(x)
	out := make([]complex128, n/2+1)
	for k := range out {
		var s complex128
		for j, v := range x {
			s += complex(v, 0) * cmplx.Rect(1, -2*math.Pi*float64(j*k%n)/float64(n))
		}
		out[k] = s
	}
	return out
}

func randVec(r *rand.Rand, n int) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = 2*r.Float64() - 1
	}
	return x
}

func TestNewPlanRejectsBadSizes(t *testing.T) {
	for _, n := range []int{0, -4, 3, 6, 12, 1000} {
		if _, err := NewPlan[float64](n); err == nil {
			t.Errorf("NewPlan(%d): no error", n)
		}
	}
}

func testForwardAgainstNaive[T Float](t *testing.T, tol float64) {
	r := rand.New(rand.NewPCG(1, 2))
	for lg := 0; lg <= 11; lg++ {
		n := 1 << lg
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			x := randVec(r, n)
			xt := make([]T, n)
			for i, v := range x {
				xt[i] = T(v)
			}
			p := For[T](n)
			spec := make([]T, p.SpectrumLen())
			p.Forward(spec, xt)
			want := naiveDFT(x)
			scale := math.Sqrt(float64(n))
			for k, w := range want {
				got := complex(float64(spec[2*k]), float64(spec[2*k+1]))
				if e := cmplx.Abs(got-w) / scale; e > tol {
					t.Fatalf("bin %d: got %v want %v (err %.3g > %.3g)", k, got, w, e, tol)
				}
			}
			back := make([]T, n)
			p.Inverse(back, spec)
			for i := range back {
				if e := math.Abs(float64(back[i] - xt[i])); e > tol {
					t.Fatalf("round trip [%d]: got %v want %v", i, back[i], xt[i])
				}
			}
		})
	}
}

func TestForwardFloat64(t *testing.T) { testForwardAgainstNaive[float64](t, 1e-13) }
func TestForwardFloat32(t *testing.T) { testForwardAgainstNaive[float32](t, 5e-6) }

// TestInverseScaled checks the scale factor and that the imaginary parts
// of the DC and Nyquist bins are ignored.
func TestInverseScaled(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	n := 64
	p := For[float64](n)
	x := randVec(r, n)
	spec := make([]float64, p.SpectrumLen())
	p.Forward(spec, x)
	spec[1], spec[n+1] = 7, -3
	y := make([]float64, n)
	p.InverseScaled(y, spec, 2)
	for i := range y {
		if math.Abs(y[i]-2*float64(n)*x[i]) > 1e-11 {
			t.Fatalf("[%d]: %v want %v", i, y[i], 2*float64(n)*x[i])
		}
	}
}

func TestForIsCached(t *testing.T) {
	if For[float64](256) != For[float64](256) {
		t.Error("For[float64](256) returned two plans")
	}
	if For[float32](256).Len() != 256 || For[float64](256).SpectrumLen() != 258 {
		t.Error("wrong sizes")
	}
}

// TestAccuracy reports the round-trip and forward error of both element
// types against a float64 naive DFT; run with -v to see the numbers.
func TestAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{256, 4096} {
		x := randVec(r, n)
		want := naiveDFT(x)
		e64 := fwdErr(For[float64](n), x, want)
		e32 := fwdErr(For[float32](n), x, want)
		t.Logf("n=%d relative forward error: float64 %.2g, float32 %.2g", n, e64, e32)
		if e64 > 1e-14 || e32 > 1e-6 {
			t.Errorf("n=%d: errors %.3g / %.3g too large", n, e64, e32)
		}
	}
}

func fwdErr[T Float](p *Plan[T], x []float64, want []complex128) float64 {
	xt := make([]T, len(x))
	for i, v := range x {
		xt[i] = T(v)
	}
	spec := make([]T, p.SpectrumLen())
	p.Forward(spec, xt)
	var num, den float64
	for k, w := range want {
		d := complex(float64(spec[2*k]), float64(spec[2*k+1])) - w
		num += real(d)*real(d) + imag(d)*imag(d)
		den += real(w)*real(w) + imag(w)*imag(w)
	}
	return math.Sqrt(num / den)
}

func benchReal[T Float](b *testing.B) {
	for lg := 6; lg <= 18; lg += 2 {
		n := 1 << lg
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			p := For[T](n)
			x := make([]T, n)
			for i := range x {
				x[i] = T(i%7) - 3
			}
			spec := make([]T, p.SpectrumLen())
			y := make([]T, n)
			b.SetBytes(int64(n))
			for b.Loop() {
				p.Forward(spec, x)
				p.Inverse(y, spec)
			}
		})
	}
}

// BenchmarkReal times one forward plus one inverse real transform.
func BenchmarkReal(b *testing.B) {
	b.Run("float64", benchReal[float64])
	b.Run("float32", benchReal[float32])
}
