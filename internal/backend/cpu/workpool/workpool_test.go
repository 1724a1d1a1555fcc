package workpool

import (
	"sync/atomic"
	"testing"
)

func TestForCoversRangeOnce(t *testing.T) {
	for _, tc := range []struct{ workers, n, grain int }{
		{1, 10, 1}, {2, 0, 1}, {2, 1, 1}, {2, 7, 1}, {3, 100, 7}, {4, 5, 100},
	} {
		p := New(tc.workers)
		hits := make([]int32, tc.n)
		p.For(tc.n, tc.grain, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				atomic.AddInt32(&hits[i], 1)
			}
		})
		for i, h := range hits {
			if h != 1 {
				t.Errorf("workers=%d n=%d grain=%d: index %d visited %d times", tc.workers, tc.n, tc.grain, i, h)
			}
		}
		p.Close()
	}
}

func TestRunCallsEveryWorker(t *testing.T) {
	p := New(3)
	defer p.Close()
	var seen [3]int32
	for iter := 0; iter < 100; iter++ {
		p.Run(func(w int) { atomic.AddInt32(&seen[w], 1) })
	}
	for w, s := range seen {
		if s != 100 {
			t.Fatalf("worker %d ran %d times, want 100", w, s)
		}
	}
}
