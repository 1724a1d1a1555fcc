// Package cpu is the host implementation of backend.Backend.
//
// Every operation runs on a persistent pool of worker goroutines
// (package workpool); matrix products go through package gemm, and the
// exponentials of softmax, cross-entropy and SwiGLU through AVX2 kernels
// where the CPU has them (vec_amd64.s), which return exactly the bits of
// the portable code.
//
// Results are deterministic: each output element is produced by one
// worker and every reduction runs in an order fixed by the problem
// dimensions, never by the number of threads, so repeated runs give
// bitwise-identical results whatever Threads() is. The one exception is
// Gemm and GemmStridedBatched, which run gemm.Sgemm on all workers and
// inherit whatever it guarantees; attention calls gemm single-threaded per
// tile and so is independent of the thread count.
//
// A Backend is safe for concurrent use by multiple goroutines; operations
// that need scratch memory hold an internal lock, and the pool serialises
// parallel loops.
package cpu

import (
	"sync"
	"sync/atomic"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu/workpool"
)

// Backend runs the operations of backend.Backend on the host CPU.
type Backend struct {
	pool *workpool.Pool

	// mu guards the scratch state below, which operations needing
	// temporary memory (attention) reuse from call to call.
	mu sync.Mutex
	// scratch is per-worker temporary memory.
	scratch [][]float32
	// shared is temporary memory used by all workers of one call.
	shared []float32

	// attnTile is the query and key tile edge of the attention kernels.
	// Results depend on it, never on the thread count; tests shrink it to
	// exercise tiling on small problems.
	attnTile int
	// attnFusedMin, when positive, replaces the thread-count rule that
	// picks the attention backward strategy (see AttentionBackward): the
	// fused one runs when there are at least attnFusedMin (batch,
	// key/value head) pairs. Both strategies give the same bits; tests
	// set it to run each.
	attnFusedMin int
}

var _ backend.Backend = (*Backend)(nil)

// defaultAttnTile is the attention tile edge (see Backend.attnTile).
const defaultAttnTile = 128

// New returns a Backend running on threads workers; threads < 1 means
// workpool.DefaultThreads().
func New(threads int) *Backend {
	p := workpool.New(threads)
	b := &Backend{
		pool:     p,
		scratch:  make([][]float32, p.Size()),
		attnTile: defaultAttnTile,
	}
	return b
}

// Name returns "cpu".
func (b *Backend) Name() string { return "cpu" }

// Threads is the number of workers operations run on.
func (b *Backend) Threads() int { return b.pool.Size() }

// Close stops the workers. The Backend must not be used afterwards.
func (b *Backend) Close() {
	b.pool.Close()
}

// Sync returns at once: CPU operations complete before they return.
func (b *Backend) Sync() {}

// forItems calls fn(worker, item) for every item in [0, n), handing items
// to workers dynamically so that unequal items balance. Each item runs on
// exactly one worker; which one must not affect the result.
func (b *Backend) forItems(n int, fn func(worker, item int)) {
	if n <= 0 {
		return
	}
	if n == 1 || b.pool.Size() == 1 {
		for i := 0; i < n; i++ {
			fn(0, i)
		}
		return
	}
	var next atomic.Int64
	b.pool.Run(func(w int) {
		for {
			i := int(next.Add(1)) - 1
			if i >= n {
				return
			}
			fn(w, i)
		}
	})
}

// workerScratch returns worker w's scratch memory, at least n elements.
// The caller must hold b.mu.
func (b *Backend) workerScratch(w, n int) []float32 {
	if len(b.scratch[w]) < n {
		b.scratch[w] = make([]float32, n)
	}
	return b.scratch[w][:n]
}

// sharedScratch returns n elements of temporary memory shared by the
// workers of one call. The caller must hold b.mu.
func (b *Backend) sharedScratch(n int) []float32 {
	if len(b.shared) < n {
		b.shared = make([]float32, n)
	}
	return b.shared[:n]
}
