package longconv

import (
	"fmt"
	"math/bits"
	"runtime"
	"sync"

	"github.com/titan-go/titan/internal/fft"
)

// DefaultDirectMax is the longest sequence Forward and Backward convolve
// directly; longer ones go through the FFT. It is the crossover measured
// by BenchmarkConvCrossover (see the package documentation).
const DefaultDirectMax = 120

// Runner runs a data-parallel loop: it calls fn on disjoint ranges
// covering [0, n), each at least grain long where possible, and returns
// when all have finished. The CPU backend's worker pool is one.
type Runner interface {
	For(n, grain int, fn func(lo, hi int))
}

// Conv holds the options of Forward and Backward. The zero Conv uses
// GOMAXPROCS goroutines and the measured crossover.
type Conv struct {
	// Threads is the number of goroutines a call uses when Runner is nil;
	// below 1 it means runtime.GOMAXPROCS(0).
	Threads int
	// DirectMax, when positive, replaces DefaultDirectMax; negative forces
	// the FFT for every length (tests use both to reach each path).
	DirectMax int
	// Runner, when set, runs the parallel loops instead of new goroutines.
	Runner Runner
}

// Forward computes the causal convolution of every channel with its
// filter, using the zero Conv.
//
// x and y are [B][C][L] and h is [C][L], flattened row-major; y[b,c,t] =
// Σ_{s≤t} h[c][t-s]·x[b,c,s]. y is overwritten and must not overlap x or h.
func Forward(y, x, h []float32, B, C, L int) { Conv{}.Forward(y, x, h, B, C, L) }

// Backward accumulates the gradients of Forward, using the zero Conv:
//
//	dx[b,c,s] += Σ_{t≥s} h[c][t-s]·dy[b,c,t]
//	dh[c][k]  += Σ_b Σ_{t≥k} dy[b,c,t]·x[b,c,t-k]
//
// with the layouts of Forward (dx like x, dh like h). dx or dh may be nil
// (of length zero) to skip that gradient.
func Backward(dx, dh, dy, x, h []float32, B, C, L int) {
	Conv{}.Backward(dx, dh, dy, x, h, B, C, L)
}

func (cv Conv) threads() int {
	if cv.Threads >= 1 {
		return cv.Threads
	}
	return runtime.GOMAXPROCS(0)
}

func (cv Conv) directMax() int {
	if cv.DirectMax != 0 {
		return cv.DirectMax
	}
	return DefaultDirectMax
}

// parallel runs fn over [0, n) in ranges, one per thread at most.
func (cv Conv) parallel(n int, fn func(lo, hi int)) {
	if cv.Runner != nil {
		cv.Runner.For(n, 1, fn)
		return
	}
	goFor(n, cv.threads(), fn)
}

// goFor splits [0, n) into at most threads contiguous ranges and runs
// them on separate goroutines (the caller takes the first).
func goFor(n, threads int, fn func(lo, hi int)) {
	goForW(n, threads, func(_, lo, hi int) { fn(lo, hi) })
}

// goForW is goFor that also passes the range's index w < threads.
func goForW(n, threads int, fn func(w, lo, hi int)) {
	if n <= 0 {
		return
	}
	parts := min(threads, n)
	if parts <= 1 {
		fn(0, 0, n)
		return
	}
	var wg sync.WaitGroup
	wg.Add(parts - 1)
	for w := 1; w < parts; w++ {
		go func(w int) {
			defer wg.Done()
			fn(w, n*w/parts, n*(w+1)/parts)
		}(w)
	}
	fn(0, 0, n/parts)
	wg.Wait()
}

func need(op, name string, x []float32, n int) []float32 {
	if len(x) < n {
		panic(fmt.Sprintf("longconv: %s: %s has %d elements, need %d", op, name, len(x), n))
	}
	return x[:n:n]
}

func checkDims(op string, B, C, L int) {
	if B < 0 || C < 0 || L < 0 {
		panic(fmt.Sprintf("longconv: %s: negative dimension B=%d C=%d L=%d", op, B, C, L))
	}
}

// fftSize is the transform size of an exact linear convolution of two
// length-L sequences restricted to outputs 0..L-1: the power of two ≥ 2L-1.
func fftSize(L int) int {
	if L <= 1 {
		return 1
	}
	return 1 << bits.Len(uint(2*L-2))
}

// Forward is the package-level Forward with cv's options.
func (cv Conv) Forward(y, x, h []float32, B, C, L int) {
	const op = "Forward"
	checkDims(op, B, C, L)
	n := B * C * L
	y, x, h = need(op, "y", y, n), need(op, "x", x, n), need(op, "h", h, C*L)
	if n == 0 {
		return
	}
	if L <= cv.directMax() {
		cv.parallel(B*C, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				c := r % C
				directForward(y[r*L:(r+1)*L], x[r*L:(r+1)*L], h[c*L:(c+1)*L])
			}
		})
		return
	}
	N := fftSize(L)
	p := fft.For[float64](N)
	// Work items are channels, split further over batch rows when there
	// are fewer channels than threads (each part then transforms the
	// filter itself).
	parts := 1
	if t := cv.threads(); C < t {
		parts = min(B, (t+C-1)/C)
	}
	cv.parallel(C*parts, func(lo, hi int) {
		s := newScratch(N)
		for it := lo; it < hi; it++ {
			c, part := it/parts, it%parts
			widen(s.a, h[c*L:(c+1)*L])
			p.Forward(s.hspec, s.a)
			for b := B * part / parts; b < B*(part+1)/parts; b++ {
				r := b*C + c
				widen(s.a, x[r*L:(r+1)*L])
				p.Forward(s.spec, s.a)
				cmulInto(s.spec, s.hspec)
				p.InverseScaled(s.a, s.spec, 1/float64(N))
				yr := y[r*L : (r+1)*L]
				for t := range yr {
					yr[t] = float32(s.a[t])
				}
			}
		}
	})
}

// Backward is the package-level Backward with cv's options.
func (cv Conv) Backward(dx, dh, dy, x, h []float32, B, C, L int) {
	const op = "Backward"
	checkDims(op, B, C, L)
	n := B * C * L
	dy, x, h = need(op, "dy", dy, n), need(op, "x", x, n), need(op, "h", h, C*L)
	wantDX, wantDH := len(dx) > 0, len(dh) > 0
	if wantDX {
		dx = need(op, "dx", dx, n)
	}
	if wantDH {
		dh = need(op, "dh", dh, C*L)
	}
	if n == 0 || !wantDX && !wantDH {
		return
	}
	if L <= cv.directMax() {
		cv.parallel(C, func(lo, hi int) {
			for c := lo; c < hi; c++ {
				hc := h[c*L : (c+1)*L]
				for b := range B {
					r := b*C + c
					dyr := dy[r*L : (r+1)*L]
					if wantDX {
						dxr := dx[r*L : (r+1)*L]
						for s := range L {
							dxr[s] += dot(hc[:L-s], dyr[s:])
						}
					}
					if wantDH {
						xr := x[r*L : (r+1)*L]
						dhc := dh[c*L : (c+1)*L]
						for k := range L {
							dhc[k] += dot(dyr[k:], xr[:L-k])
						}
					}
				}
			}
		})
		return
	}
	N := fftSize(L)
	p := fft.For[float64](N)
	inv := 1 / float64(N)
	cv.parallel(C, func(lo, hi int) {
		s := newScratch(N)
		for c := lo; c < hi; c++ {
			widen(s.a, h[c*L:(c+1)*L])
			p.Forward(s.hspec, s.a)
			clear(s.acc)
			for b := range B {
				r := b*C + c
				widen(s.a, dy[r*L:(r+1)*L])
				p.Forward(s.dyspec, s.a)
				if wantDH {
					widen(s.a, x[r*L:(r+1)*L])
					p.Forward(s.spec, s.a)
					cmulConjAdd(s.acc, s.dyspec, s.spec)
				}
				if wantDX {
					// Correlation: DX = DY·conj(H); the wrap-around of the
					// circular correlation lands where h is zero padding.
					cmulConjInto(s.dyspec, s.hspec)
					p.InverseScaled(s.a, s.dyspec, inv)
					dxr := dx[r*L : (r+1)*L]
					for t := range dxr {
						dxr[t] += float32(s.a[t])
					}
				}
			}
			if wantDH {
				p.InverseScaled(s.a, s.acc, inv)
				dhc := dh[c*L : (c+1)*L]
				for k := range dhc {
					dhc[k] += float32(s.a[k])
				}
			}
		}
	})
}

// directForward sets y[t] = Σ_{k≤t} h[k]·x[t-k] for one row.
func directForward(y, x, h []float32) {
	L := len(y)
	clear(y)
	for k := range L {
		axpy(y[k:], h[k], x[:L-k])
	}
}

// scratch is the float64 working memory of one FFT convolution worker.
type scratch struct {
	a                        []float64 // N real values
	spec, hspec, dyspec, acc []float64 // half spectra
}

func newScratch(N int) *scratch {
	S := 2 * (N/2 + 1)
	buf := make([]float64, N+4*S)
	return &scratch{
		a:      buf[:N],
		spec:   buf[N : N+S],
		hspec:  buf[N+S : N+2*S],
		dyspec: buf[N+2*S : N+3*S],
		acc:    buf[N+3*S : N+4*S],
	}
}
