package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/titan-go/titan/internal/backend"
)

// refAdamW is one step of AdamW (decoupled weight decay, bias-corrected
// moments) in float64, from the algorithm's definition.
func refAdamW(p, g, m, v []float64, lr, b1, b2, eps, wd, gs float64, t int) {
	for i := range p {
		gi := g[i] * gs
		p[i] *= 1 - lr*wd
		m[i] = b1*m[i] + (1-b1)*gi
		v[i] = b2*v[i] + (1-b2)*gi*gi
		mhat := m[i] / (1 - math.Pow(b1, float64(t)))
		vhat := v[i] / (1 - math.Pow(b2, float64(t)))
		p[i] -= lr * mhat / (math.Sqrt(vhat) + eps)
	}
}

func TestAdamW(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		n                       int
		lr, b1, b2, eps, wd, gs float32
		gradScale               float64 // gradient magnitude
		threads                 int
	}{
		{"plain", 100, 1e-2, 0.9, 0.999, 1e-8, 0, 1, 1, 1},
		{"decay and clipping", 1000, 3e-3, 0.9, 0.95, 1e-8, 0.1, 0.25, 3, 3},
		{"tiny gradients", 50, 1e-2, 0.8, 0.99, 1e-6, 0.01, 1, 1e-7, 2},
		{"large vector", 200000, 1e-3, 0.9, 0.999, 1e-8, 0.1, 0.5, 1, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.threads)
			r := newRand(12)
			p0 := randF32(r, tc.n, 1)
			pt, gt := upload(b, p0), b.Alloc(backend.Float32, tc.n)
			mt, vt := b.Alloc(backend.Float32, tc.n), b.Alloc(backend.Float32, tc.n)
			p, m, v := f64s(p0), make([]float64, tc.n), make([]float64, tc.n)
			for step := 1; step <= 5; step++ {
				g := randF32(r, tc.n, tc.gradScale)
				b.Upload(gt, g)
				b.AdamW(pt, gt, mt, vt, tc.lr, tc.b1, tc.b2, tc.eps, tc.wd, tc.gs, step)
				refAdamW(p, f64s(g), m, v, float64(tc.lr), float64(tc.b1), float64(tc.b2), float64(tc.eps), float64(tc.wd), float64(tc.gs), step)
			}
			// float32 parameters round at every step (half an ulp of 1
			// is 6e-8); the moments cancel, so their tolerance scales
			// with the gradients.
			gmax := tc.gradScale * float64(tc.gs)
			checkClose(t, "params", download(b, pt), p, 4e-7, 3e-7)
			checkClose(t, "m", download(b, mt), m, 1e-7*gmax, 2e-6)
			checkClose(t, "v", download(b, vt), v, 1e-7*gmax*gmax, 2e-6)
		})
	}
}

func TestAdamWBadStep(t *testing.T) {
	b := newTestBackend(t, 1)
	x := b.Alloc(backend.Float32, 4)
	mustPanic(t, "step 0", func() { b.AdamW(x, x, x, x, 1e-3, 0.9, 0.999, 1e-8, 0, 1, 0) }, "AdamW", "step 0")
}

// TestAdamWVectorMatchesScalar: the vector kernel agrees with the scalar
// loop to within an ulp-sized relative error on every element.
func TestAdamWVectorMatchesScalar(t *testing.T) {
	if !useAdamWAVX2 {
		t.Skip("no vector AdamW on this machine")
	}
	const n = 1003
	r := rand.New(rand.NewPCG(9, 9))
	init := func() [4][]float32 {
		var s [4][]float32
		for i := range s {
			s[i] = make([]float32, n)
			for j := range s[i] {
				s[i][j] = float32(r.NormFloat64())
				if i == 3 {
					s[i][j] *= s[i][j] // v >= 0
				}
			}
		}
		return s
	}
	a := init()
	var bufs [2][4][]float32
	for k := range bufs {
		for i := range a {
			bufs[k][i] = append([]float32(nil), a[i]...)
		}
	}
	b := New(2)
	defer b.Close()
	for k, vec := range []bool{false, true} {
		useAdamWAVX2 = vec
		ts := make([]backend.Tensor, 4)
		for i := range ts {
			ts[i] = b.Alloc(backend.Float32, n)
			b.Upload(ts[i], bufs[k][i])
		}
		for step := 1; step <= 3; step++ {
			b.AdamW(ts[0], ts[1], ts[2], ts[3], 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.7, step)
		}
		for i := range ts {
			b.Download(bufs[k][i], ts[i])
		}
	}
	useAdamWAVX2 = true
	for i, name := range []string{"params", "grads", "m", "v"} {
		for j := range bufs[0][i] {
			x, y := float64(bufs[0][i][j]), float64(bufs[1][i][j])
			if math.Abs(x-y) > 1e-6*math.Max(math.Abs(x), 1e-3) {
				t.Fatalf("%s[%d]: scalar %v, vector %v", name, j, x, y)
			}
		}
	}
}
