package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/backend"
)

// newTestBackend returns a Backend with threads workers closed at the end
// of the test.
func newTestBackend(t testing.TB, threads int) *Backend {
	t.Helper()
	b := New(threads)
	t.Cleanup(b.Close)
	return b
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x7469746e)) }

// randF32 returns n values uniform in [-s, s).
func randF32(r *rand.Rand, n int, s float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32((2*r.Float64() - 1) * s)
	}
	return x
}

func f64s(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// upload returns a new float32 tensor holding x.
func upload(b *Backend, x []float32) backend.Tensor {
	t := b.Alloc(backend.Float32, len(x))
	b.Upload(t, x)
	return t
}

func uploadI32(b *Backend, x []int32) backend.Tensor {
	t := b.Alloc(backend.Int32, len(x))
	b.Upload(t, x)
	return t
}

func download(b *Backend, t backend.Tensor) []float32 {
	x := make([]float32, t.Len)
	b.Download(x, t)
	return x
}

// checkClose reports elements where |got - want| > atol + rtol*|want|.
// NaN and infinities must match exactly.
func checkClose(t *testing.T, name string, got []float32, want []float64, atol, rtol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d elements, want %d", name, len(got), len(want))
	}
	bad := 0
	for i := range got {
		g, w := float64(got[i]), want[i]
		if math.IsNaN(w) || math.IsInf(w, 0) {
			if !(math.IsNaN(w) && math.IsNaN(g)) && g != w {
				bad++
				if bad <= 5 {
					t.Errorf("%s[%d] = %v, want %v", name, i, g, w)
				}
			}
			continue
		}
		if !(math.Abs(g-w) <= atol+rtol*math.Abs(w)) {
			bad++
			if bad <= 5 {
				t.Errorf("%s[%d] = %.9g, want %.9g (diff %.3g)", name, i, g, w, g-w)
			}
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d of %d elements differ", name, bad, len(got))
	}
}

// gradInput is one differentiable input of a gradient check: the float64
// reference's copy of the input, which the check perturbs, and the
// backend's gradient for it.
type gradInput struct {
	name string
	x    []float64
	grad []float32
}

// checkGrads compares each input's gradient with central differences of
// loss at up to samples coordinates per input (all of them when fewer).
// The tolerance is relative to the largest finite difference seen.
func checkGrads(t *testing.T, r *rand.Rand, loss func() float64, inputs []gradInput, samples int) {
	t.Helper()
	for _, in := range inputs {
		if len(in.grad) != len(in.x) {
			t.Fatalf("%s: gradient has %d elements, input %d", in.name, len(in.grad), len(in.x))
		}
		idx := make([]int, 0, samples)
		if len(in.x) <= samples {
			for i := range in.x {
				idx = append(idx, i)
			}
		} else {
			for range samples {
				idx = append(idx, r.IntN(len(in.x)))
			}
		}
		fd := make([]float64, len(idx))
		var big float64
		for n, i := range idx {
			x0 := in.x[i]
			const h = 1e-4
			in.x[i] = x0 + h
			lp := loss()
			in.x[i] = x0 - h
			lm := loss()
			in.x[i] = x0
			fd[n] = (lp - lm) / (2 * h)
			big = math.Max(big, math.Abs(fd[n]))
		}
		bad := 0
		for n, i := range idx {
			g := float64(in.grad[i])
			if !(math.Abs(g-fd[n]) <= 2e-3*math.Abs(fd[n])+2e-4*big+1e-6) {
				bad++
				if bad <= 5 {
					t.Errorf("d%s[%d] = %.7g, finite difference %.7g", in.name, i, g, fd[n])
				}
			}
		}
		if bad > 5 {
			t.Errorf("d%s: %d of %d sampled coordinates differ", in.name, bad, len(idx))
		}
	}
}

// weightedSum is the test loss sum(out * w).
func weightedSum(out, w []float64) float64 {
	var s float64
	for i := range out {
		s += out[i] * w[i]
	}
	return s
}

// withBase returns a gradient buffer pre-filled with base, and a function
// that downloads it and subtracts base, so checks see what one backward
// call accumulated.
func withBase(b *Backend, base []float32) (backend.Tensor, func() []float32) {
	t := upload(b, base)
	return t, func() []float32 {
		g := download(b, t)
		for i := range g {
			g[i] -= base[i]
		}
		return g
	}
}

// mustPanic runs f and checks that it panics with a message containing
// every one of parts.
func mustPanic(t *testing.T, name string, f func(), parts ...string) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if r == nil {
			t.Errorf("%s: no panic", name)
			return
		}
		msg := fmt.Sprint(r)
		for _, p := range parts {
			if !strings.Contains(msg, p) {
				t.Errorf("%s: panic %q does not mention %q", name, msg, p)
			}
		}
	}()
	f()
}
