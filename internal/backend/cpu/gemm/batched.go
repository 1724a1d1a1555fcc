package gemm

import (
	"sync"
	"sync/atomic"

	"github.com/titan-go/titan/internal/backend/cpu/workpool"
)

// SgemmStridedBatched computes batch independent multiplications
// C_i = alpha*op(A_i)*op(B_i) + beta*C_i for i < batch, where matrix i of A
// starts at element i*strideA of a, and likewise for B and C. Shapes,
// transposes and leading dimensions are as for Sgemm and shared by all
// matrices. strideA or strideB may be 0 to reuse one matrix; the C
// matrices must not overlap.
//
// Small matrices are spread over the workers of p, each worker claiming
// one whole multiplication at a time; large ones run one after the other,
// each on all workers. p may be nil, which runs single-threaded.
// SgemmStridedBatched panics on invalid dimensions, leading dimensions,
// strides or slice lengths.
func SgemmStridedBatched(p *workpool.Pool, transA, transB bool, m, n, k int, alpha float32, a []float32, lda, strideA int, b []float32, ldb, strideB int, beta float32, c []float32, ldc, strideC int, batch int) {
	checkArgs(transA, transB, m, n, k, len(a), lda, strideA, len(b), ldb, strideB, len(c), ldc, strideC, batch)
	if batch == 0 || m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		// A and B may be empty: do not slice them per matrix.
		for i := 0; i < batch; i++ {
			scale(m, n, beta, c[i*strideC:], ldc)
		}
		return
	}
	threads := 1
	if p != nil {
		threads = p.Size()
	}
	kern := active.Load()
	flops := 2 * float64(m) * float64(n) * float64(k)
	if threads > 1 && batch > 1 && (flops < 8*minParallelFlops || batch%threads == 0 || batch >= 4*threads) {
		j := batchPool.Get().(*batchJob)
		j.kern, j.transA, j.transB = kern, transA, transB
		j.m, j.n, j.k, j.alpha, j.beta = m, n, k, alpha, beta
		j.a, j.lda, j.strideA = a, lda, strideA
		j.b, j.ldb, j.strideB = b, ldb, strideB
		j.c, j.ldc, j.strideC = c, ldc, strideC
		j.batch = batch
		j.next.Store(0)
		p.Run(j.fn)
		j.a, j.b, j.c = nil, nil, nil
		batchPool.Put(j)
		return
	}
	for i := 0; i < batch; i++ {
		gemm(p, threads, kern, transA, transB, m, n, k, alpha, a[i*strideA:], nil, lda, b[i*strideB:], nil, ldb, beta, c[i*strideC:], nil, ldc)
	}
}

// A batchJob is a batched multiplication spread over a pool, one matrix
// per worker at a time.
type batchJob struct {
	kern                      *kernel
	transA, transB            bool
	m, n, k                   int
	alpha, beta               float32
	a, b, c                   []float32
	lda, ldb, ldc             int
	strideA, strideB, strideC int
	batch                     int
	next                      atomic.Int64     // the next matrix to claim
	fn                        func(worker int) // run, bound once so that Run does not allocate
}

var batchPool = sync.Pool{New: func() any {
	j := new(batchJob)
	j.fn = j.run
	return j
}}

// run multiplies matrices one at a time, claiming each, until none is
// left; workers that are slowed down simply claim fewer.
func (j *batchJob) run(int) {
	for {
		i := int(j.next.Add(1) - 1)
		if i >= j.batch {
			return
		}
		gemm(nil, 1, j.kern, j.transA, j.transB, j.m, j.n, j.k, j.alpha,
			j.a[i*j.strideA:], nil, j.lda, j.b[i*j.strideB:], nil, j.ldb, j.beta, j.c[i*j.strideC:], nil, j.ldc)
	}
}
