package cpu

import (
	"fmt"
	"testing"

	"github.com/titan-go/titan/internal/backend"
)

// refCausalConv is the float64 direct causal convolution and its
// gradients, for [B,C,L] x and [C,L] h.
func refCausalConv(x, h, dy []float32, B, C, L int) (y, dx, dh []float64) {
	y = make([]float64, B*C*L)
	dx = make([]float64, B*C*L)
	dh = make([]float64, C*L)
	for b := range B {
		for c := range C {
			o := (b*C + c) * L
			for t := range L {
				for s := 0; s <= t; s++ {
					y[o+t] += float64(h[c*L+t-s]) * float64(x[o+s])
					dx[o+s] += float64(h[c*L+t-s]) * float64(dy[o+t])
					dh[c*L+t-s] += float64(dy[o+t]) * float64(x[o+s])
				}
			}
		}
	}
	return y, dx, dh
}

func TestCausalConv(t *testing.T) {
	for _, tc := range []struct{ B, C, L, threads int }{
		{1, 1, 1, 1}, {2, 3, 7, 2}, {2, 3, 300, 3}, {1, 4, 1000, 2},
	} {
		t.Run(fmt.Sprintf("B=%d,C=%d,L=%d,threads=%d", tc.B, tc.C, tc.L, tc.threads), func(t *testing.T) {
			b := newTestBackend(t, tc.threads)
			var lc backend.LongConv = b
			r := newRand(21)
			B, C, L := tc.B, tc.C, tc.L
			x := randF32(r, B*C*L, 1)
			h := randF32(r, C*L, 0.1)
			dy := randF32(r, B*C*L, 1)
			wantY, wantDX, wantDH := refCausalConv(x, h, dy, B, C, L)

			xt, ht, dyt := upload(b, x), upload(b, h), upload(b, dy)
			yt := b.Alloc(backend.Float32, B*C*L)
			lc.CausalConv(yt, xt, ht, B, C, L)
			tol := 1e-5 * float64(L)
			checkClose(t, "y", download(b, yt), wantY, tol, 1e-5)

			// Accumulation: start the gradients from ones.
			ones := func(n int) []float32 {
				v := make([]float32, n)
				for i := range v {
					v[i] = 1
				}
				return v
			}
			dxt, dht := upload(b, ones(B*C*L)), upload(b, ones(C*L))
			lc.CausalConvBackward(dxt, dht, dyt, xt, ht, B, C, L)
			for i := range wantDX {
				wantDX[i]++
			}
			for i := range wantDH {
				wantDH[i]++
			}
			checkClose(t, "dx", download(b, dxt), wantDX, tol, 1e-5)
			checkClose(t, "dh", download(b, dht), wantDH, tol, 1e-5)

			// A zero dh is skipped.
			dx2 := upload(b, ones(B*C*L))
			lc.CausalConvBackward(dx2, backend.Tensor{}, dyt, xt, ht, B, C, L)
			checkClose(t, "dx (no dh)", download(b, dx2), wantDX, tol, 1e-5)
		})
	}
}

func TestCausalConvPanicsOnShortTensor(t *testing.T) {
	b := newTestBackend(t, 1)
	x := b.Alloc(backend.Float32, 6)
	h := b.Alloc(backend.Float32, 3)
	y := b.Alloc(backend.Float32, 5)
	mustPanic(t, "short y", func() { b.CausalConv(y, x, h, 2, 1, 3) }, "CausalConv", "y")
}
