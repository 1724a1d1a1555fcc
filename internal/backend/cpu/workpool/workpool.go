// Package workpool runs data-parallel loops on a fixed set of goroutines
// that live as long as the pool, so that a kernel launch costs a channel
// send per worker instead of a goroutine start.
package workpool

import (
	"os"
	"runtime"
	"strconv"
	"sync"
)

// Pool is a persistent set of workers. The goroutine calling Run takes
// part as worker 0. A Pool runs one loop at a time; concurrent calls to
// Run are serialised.
type Pool struct {
	n    int
	mu   sync.Mutex
	jobs []chan job
	wg   sync.WaitGroup
}

type job struct {
	fn func(worker int)
}

// New starts a pool of n workers (n < 1 means DefaultThreads()).
func New(n int) *Pool {
	if n < 1 {
		n = DefaultThreads()
	}
	p := &Pool{n: n, jobs: make([]chan job, n)}
	for w := 1; w < n; w++ {
		ch := make(chan job)
		p.jobs[w] = ch
		go func(w int) {
			for j := range ch {
				j.fn(w)
				p.wg.Done()
			}
		}(w)
	}
	return p
}

// DefaultThreads is TITAN_NUM_THREADS when set to a positive integer,
// otherwise the number of CPUs usable by this process.
func DefaultThreads() int {
	if s := os.Getenv("TITAN_NUM_THREADS"); s != "" {
		if v, err := strconv.Atoi(s); err == nil && v > 0 {
			return v
		}
	}
	return runtime.GOMAXPROCS(0)
}

// Size is the number of workers, the caller included.
func (p *Pool) Size() int { return p.n }

// Close stops the workers. The pool must not be used afterwards.
func (p *Pool) Close() {
	for w := 1; w < p.n; w++ {
		close(p.jobs[w])
	}
}

// Run calls fn(w) once on every worker w in [0, Size()) and waits for all.
func (p *Pool) Run(fn func(worker int)) {
	if p.n == 1 {
		fn(0)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.wg.Add(p.n - 1)
	for w := 1; w < p.n; w++ {
		p.jobs[w] <- job{fn: fn}
	}
	fn(0)
	p.wg.Wait()
}

// For splits [0, n) into at most Size() contiguous ranges of at least
// grain elements and calls fn(lo, hi) for each range in parallel.
func (p *Pool) For(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	parts := (n + grain - 1) / grain
	if parts > p.n {
		parts = p.n
	}
	if parts <= 1 {
		fn(0, n)
		return
	}
	p.Run(func(w int) {
		if w >= parts {
			return
		}
		lo := n * w / parts
		hi := n * (w + 1) / parts
		if lo < hi {
			fn(lo, hi)
		}
	})
}
