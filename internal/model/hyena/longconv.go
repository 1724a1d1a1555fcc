package hyena

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/titan-go/titan/internal/backend"
)

// longConv is the capability a backend offers for the long causal
// convolution (the method set of backend.LongConv, which is being added
// with its FFT implementation): channel-major [B, C, L] buffers, h
// [C, L], y[b,c,t] = Σ_{s≤t} h[c, t-s]·x[b,c,s]; the backward accumulates
// dx and dh.
type longConv interface {
	CausalConv(y, x, h backend.Tensor, B, C, L int)
	CausalConvBackward(dx, dh, dy, x, h backend.Tensor, B, C, L int)
}

// causalConv computes y = h ∗ x with the backend's long convolution, or
// with directCausalConv when the backend has none.
func causalConv(be backend.Backend, y, x, h backend.Tensor, B, C, L int) {
	if lc, ok := be.(longConv); ok {
		lc.CausalConv(y, x, h, B, C, L)
		return
	}
	directCausalConv(y, x, h, B, C, L)
}

// causalConvBackward accumulates the long convolution's dx and dh.
func causalConvBackward(be backend.Backend, dx, dh, dy, x, h backend.Tensor, B, C, L int) {
	if lc, ok := be.(longConv); ok {
		lc.CausalConvBackward(dx, dh, dy, x, h, B, C, L)
		return
	}
	directCausalConvBackward(dx, dh, dy, x, h, B, C, L)
}

// hostF32 returns the n float32 elements of a host tensor; the direct
// convolution below is a stand-in for backends without backend.LongConv
// and runs on host memory only.
func hostF32(name string, t backend.Tensor, n int) []float32 {
	h, ok := t.HostFloat32()
	if !ok || len(h) < n {
		panic(fmt.Sprintf("hyena: direct long convolution: %s is not %d host float32 elements (the backend has no LongConv)", name, n))
	}
	return h[:n:n]
}

// parallelRows calls fn(r) for every r in [0, n) on up to GOMAXPROCS
// goroutines, each r on exactly one.
func parallelRows(n int, fn func(r int)) {
	w := min(runtime.GOMAXPROCS(0), n)
	if w <= 1 {
		for r := 0; r < n; r++ {
			fn(r)
		}
		return
	}
	var wg sync.WaitGroup
	for k := 0; k < w; k++ {
		wg.Add(1)
		go func(k int) {
			defer wg.Done()
			for r := k; r < n; r += w {
				fn(r)
			}
		}(k)
	}
	wg.Wait()
}

// directCausalConv is the O(L²) causal convolution y[b,c,t] =
// Σ_{s≤t} h[c,t-s]·x[b,c,s], each sum in float64 in increasing s.
func directCausalConv(y, x, h backend.Tensor, B, C, L int) {
	ys, xs, hs := hostF32("y", y, B*C*L), hostF32("x", x, B*C*L), hostF32("h", h, C*L)
	parallelRows(B*C, func(r int) {
		c := r % C
		xr, yr, hc := xs[r*L:(r+1)*L], ys[r*L:(r+1)*L], hs[c*L:(c+1)*L]
		for t := range yr {
			var s float64
			for j := 0; j <= t; j++ {
				s += float64(hc[t-j]) * float64(xr[j])
			}
			yr[t] = float32(s)
		}
	})
}

// directCausalConvBackward accumulates dx[b,c,s] += Σ_{t≥s} h[c,t-s]·dy[b,c,t]
// and dh[c,k] += Σ_b Σ_t dy[b,c,t]·x[b,c,t-k].
func directCausalConvBackward(dx, dh, dy, x, h backend.Tensor, B, C, L int) {
	dxs, dhs := hostF32("dx", dx, B*C*L), hostF32("dh", dh, C*L)
	dys, xs, hs := hostF32("dy", dy, B*C*L), hostF32("x", x, B*C*L), hostF32("h", h, C*L)
	parallelRows(C, func(c int) {
		hc, dhc := hs[c*L:(c+1)*L], dhs[c*L:(c+1)*L]
		acc := make([]float64, L)
		for b := 0; b < B; b++ {
			r := b*C + c
			xr, dyr, dxr := xs[r*L:(r+1)*L], dys[r*L:(r+1)*L], dxs[r*L:(r+1)*L]
			for s := range dxr {
				var v float64
				for t := s; t < L; t++ {
					v += float64(hc[t-s]) * float64(dyr[t])
				}
				dxr[s] += float32(v)
			}
			for k := range acc {
				var v float64
				for t := k; t < L; t++ {
					v += float64(dyr[t]) * float64(xr[t-k])
				}
				acc[k] += v
			}
		}
		for k, v := range acc {
			dhc[k] += float32(v)
		}
	})
}
