package cpu

import (
	"math"
	"testing"

	"github.com/titan-go/titan/internal/backend"
)

func TestElementwise(t *testing.T) {
	for _, tc := range []struct {
		n, threads int
	}{{0, 1}, {1, 2}, {13, 3}, {100003, 3}} {
		b := newTestBackend(t, tc.threads)
		r := newRand(uint64(tc.n))
		x, y := randF32(r, tc.n, 1), randF32(r, tc.n, 1)
		want := make([]float64, tc.n)

		xt, yt, out := upload(b, x), upload(b, y), b.Alloc(backend.Float32, tc.n)
		b.Add(out, xt, yt)
		for i := range want {
			want[i] = float64(x[i] + y[i])
		}
		checkClose(t, "Add", download(b, out), want, 0, 0)
		b.Add(xt, xt, yt) // aliased
		checkClose(t, "Add in place", download(b, xt), want, 0, 0)

		b.Upload(xt, x)
		b.Axpy(yt, -0.5, xt)
		for i := range want {
			want[i] = float64(y[i] + -0.5*x[i])
		}
		checkClose(t, "Axpy", download(b, yt), want, 0, 0)

		b.Scale(xt, 3)
		for i := range want {
			want[i] = float64(3 * x[i])
		}
		checkClose(t, "Scale", download(b, xt), want, 0, 0)

		b.Copy(out, xt)
		checkClose(t, "Copy", download(b, out), want, 0, 0)
		b.Zero(out)
		clear(want)
		checkClose(t, "Zero", download(b, out), want, 0, 0)
	}
}

func TestSumSquares(t *testing.T) {
	for _, n := range []int{0, 1, 7, sumSquaresBlock, 3*sumSquaresBlock + 5, 100003} {
		x := randF32(newRand(uint64(n)), n, 2)
		var want float64
		for _, v := range x {
			want += float64(v) * float64(v)
		}
		var first float64
		for threads := 1; threads <= 3; threads++ {
			b := newTestBackend(t, threads)
			got := b.SumSquares(upload(b, x))
			if math.Abs(got-want) > 1e-12*want {
				t.Errorf("n=%d threads=%d: SumSquares = %v, want %v", n, threads, got, want)
			}
			if threads == 1 {
				first = got
			} else if got != first {
				t.Errorf("n=%d: %d threads give %v, one thread %v", n, threads, got, first)
			}
		}
	}
}

func TestElementwiseLengthMismatch(t *testing.T) {
	b := newTestBackend(t, 1)
	x, y := b.Alloc(backend.Float32, 3), b.Alloc(backend.Float32, 4)
	mustPanic(t, "Add", func() { b.Add(x, x, y) }, "Add", "lengths")
	mustPanic(t, "Axpy", func() { b.Axpy(x, 1, y) }, "Axpy", "lengths")
	mustPanic(t, "Copy", func() { b.Copy(x, y) }, "Copy")
}
