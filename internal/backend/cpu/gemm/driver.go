package gemm

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/titan-go/titan/internal/numeric"
)

// A plan is one multiplication in flight: its operands, blocking, the
// work split and the pack buffers. Plans are recycled through planPool so
// that steady-state calls do not allocate.
//
// The loop nest runs over blocks of nc columns of C. For each block the
// workers first pack all of op(B)'s k×nc panel together, in chunks they
// claim one at a time, and wait until it is complete; when items would
// otherwise pack the same rows of op(A) more than once and all of it fits
// in packedAFloats, it is packed in the same way, once, with the first
// block. Then they claim work items, each a range of rows of C and a
// range of its nr-column panels; an item loops over K in steps of kc,
// packs its rows of op(A) for the step into the worker's own buffer unless
// A is packed already, and runs the micro-kernel over its tiles. Claiming
// work instead of splitting it up front keeps all workers busy when one
// of them is slowed down.
type plan struct {
	kern           *kernel
	transA, transB bool
	m, n, k        int
	alpha, beta    float32
	a, b, c        []float32
	ah, bh, ch     []uint16 // A, B and C when they are bfloat16 (a, b, c nil)
	lda, ldb, ldc  int

	kc, nc    int // K step and N block
	nt        int // workers taking part
	rowBlocks int // row ranges per N block
	colGroups int // panel ranges per N block
	packGroup int // panels per B packing chunk

	bbuf   *buffer   // op(B)'s k×nc panel, packed
	apk    *buffer   // all of op(A), packed, or nil
	abuf   []*buffer // per-worker packed rows of op(A) for one K step, without apk
	ctile  []*buffer // per-worker float32 tile of an item's C, with ch
	workFn func(worker int)

	// Work counters, cumulative over the N blocks, each on its own cache
	// line: chunks of B claimed and packed, items claimed and done.
	packNext, packDone, itemNext, itemDone paddedCounter

	// A worker that has spun for a while on a counter sleeps on wake
	// (guarded by mu) until the worker completing the count wakes it.
	mu   sync.Mutex
	wake *sync.Cond
}

type paddedCounter struct {
	atomic.Int64
	_ [56]byte
}

var planPool = sync.Pool{New: func() any {
	pl := new(plan)
	pl.workFn = pl.work // bound once so that Run does not allocate
	pl.wake = sync.NewCond(&pl.mu)
	return pl
}}

// Tuning of the work split.
const (
	// packedBFloats bounds the packed k×nc panel of op(B).
	packedBFloats = 4 << 20
	// packedAFloats bounds the size of op(A) packed whole, up front.
	packedAFloats = 4 << 20
	// itemsPerWorker is how many work items per worker a parallel
	// multiplication aims for, so that a slowed worker is made up for.
	itemsPerWorker = 6
	// minItemRows and minItemPanels bound an item from below, in
	// micro-kernel rows and panels: each B micro-panel brought in from L3
	// should serve several micro-kernel calls, and each packed A block
	// several panels.
	minItemRows   = 8
	minItemPanels = 4
	// packChunkPanels is the number of B panels packed per claimed chunk.
	packChunkPanels = 4
	// tileFloats bounds the float32 tile in which an item accumulates a
	// bfloat16 C over the K steps (256 KiB, in L2 beside the packed A
	// block): items are narrowed to fit it.
	tileFloats = 1 << 16
)

// newPlan prepares a multiplication of checked operands with at most
// threads workers. Each matrix is given as float32 or, only for the
// kernels of GemmBF16, as bfloat16 (ah, bh, ch), the other slice nil.
func newPlan(kern *kernel, threads int, transA, transB bool, m, n, k int, alpha float32, a []float32, ah []uint16, lda int, b []float32, bh []uint16, ldb int, beta float32, c []float32, ch []uint16, ldc int) *plan {
	pl := planPool.Get().(*plan)
	pl.kern = kern
	pl.transA, pl.transB = transA, transB
	pl.m, pl.n, pl.k = m, n, k
	pl.alpha, pl.beta = alpha, beta
	pl.a, pl.ah, pl.lda = a, ah, lda
	pl.b, pl.bh, pl.ldb = b, bh, ldb
	pl.c, pl.ch, pl.ldc = c, ch, ldc

	mr, nr := kern.mr, kern.nr
	kw := kern.words(k) // packed depth of all of K
	// Balanced K steps: k = kc+1 runs as two steps of about k/2.
	pl.kc = balance(k, kern.kc, kern.kpack)
	pl.nc = balance(n, max(nr, packedBFloats/kw/nr*nr), nr)
	pl.packGroup = packChunkPanels

	mb := (m + mr - 1) / mr
	np := (pl.nc + nr - 1) / nr
	maxRowBlock := max(1, kern.mc/mr)
	pl.nt, pl.rowBlocks, pl.colGroups = 1, (mb+maxRowBlock-1)/maxRowBlock, 1
	if threads > 1 && 2*float64(m)*float64(n)*float64(k) >= minParallelFlops {
		pl.nt = threads
		target := itemsPerWorker * threads
		pl.rowBlocks = max(pl.rowBlocks, min(target, mb/minItemRows), 1)
		if pl.rowBlocks < target {
			pl.colGroups = max(1, min((target+pl.rowBlocks-1)/pl.rowBlocks, np/minItemPanels))
		}
		pl.fitTile(mb, np)
		// Equal workers finish together when the items divide evenly.
		for rb := pl.rowBlocks; rb < pl.rowBlocks+threads && rb <= mb; rb++ {
			if rb*pl.colGroups%threads == 0 {
				pl.rowBlocks = rb
				break
			}
		}
	}
	pl.fitTile(mb, np) // single-threaded plans (a no-op after the split above)

	pl.bbuf = getBuffer(&bPool, kw*np*nr)
	// Packing A whole saves work when items would pack the same rows
	// more than once: for several column groups or several N blocks.
	// Otherwise an item's freshly packed rows are still in L2 when used.
	if (pl.colGroups > 1 || pl.nc < n) && mb*mr*kw <= packedAFloats {
		pl.apk = getBuffer(&bPool, mb*mr*kw)
	} else {
		rows := (mb + pl.rowBlocks - 1) / pl.rowBlocks * mr
		for w := 0; w < pl.nt; w++ {
			pl.abuf = append(pl.abuf, getBuffer(&aPool, kern.words(pl.kc)*rows))
		}
	}
	if ch != nil {
		rows := (mb + pl.rowBlocks - 1) / pl.rowBlocks * mr
		panels := (np + pl.colGroups - 1) / pl.colGroups
		for w := 0; w < pl.nt; w++ {
			pl.ctile = append(pl.ctile, getBuffer(&cPool, rows*panels*nr))
		}
	}
	for _, ctr := range []*paddedCounter{&pl.packNext, &pl.packDone, &pl.itemNext, &pl.itemDone} {
		ctr.Store(0)
	}
	return pl
}

// balance splits total into ceil(total/limit) near-equal blocks of at
// most limit, rounded up to a multiple of unit, and returns the block size.
func balance(total, limit, unit int) int {
	if total <= limit {
		return roundUp(total, unit)
	}
	blocks := (total + limit - 1) / limit
	return min(limit, roundUp((total+blocks-1)/blocks, unit))
}

func roundUp(x, unit int) int { return (x + unit - 1) / unit * unit }

// fitTile raises colGroups, for a bfloat16 C, until the tile of every
// item (at most ceil(mb/rowBlocks)·mr rows of ceil(np/colGroups) panels)
// holds at most tileFloats floats, or one panel.
func (pl *plan) fitTile(mb, np int) {
	if pl.ch == nil {
		return
	}
	rows := (mb + pl.rowBlocks - 1) / pl.rowBlocks * pl.kern.mr
	panels := max(1, tileFloats/(rows*pl.kern.nr))
	pl.colGroups = max(pl.colGroups, (np+panels-1)/panels)
}

// release returns pl's buffers to their pools and pl to planPool.
func (pl *plan) release() {
	bPool.Put(pl.bbuf)
	pl.bbuf = nil
	if pl.apk != nil {
		bPool.Put(pl.apk)
		pl.apk = nil
	}
	for i, ab := range pl.abuf {
		aPool.Put(ab)
		pl.abuf[i] = nil
	}
	pl.abuf = pl.abuf[:0]
	for i, ct := range pl.ctile {
		cPool.Put(ct)
		pl.ctile[i] = nil
	}
	pl.ctile = pl.ctile[:0]
	pl.a, pl.b, pl.c, pl.ah, pl.bh, pl.ch = nil, nil, nil, nil, nil, nil
	planPool.Put(pl)
}

// work is worker w's part of the multiplication.
func (pl *plan) work(w int) {
	if w >= pl.nt {
		return
	}
	kern := pl.kern
	mr, nr := kern.mr, kern.nr
	n, k, kc := pl.n, pl.k, pl.kc
	kb := (k + kc - 1) / kc
	bb := pl.bbuf.f
	var abuf, tile []float32
	if pl.apk == nil {
		abuf = pl.abuf[w].f
	}
	if pl.ch != nil {
		tile = pl.ctile[w].f
	}
	// Chunks of A to pack with the first N block.
	mb := (pl.m + mr - 1) / mr
	aChunksPerStep := 0
	if pl.apk != nil {
		aChunksPerStep = (mb + pl.packGroup - 1) / pl.packGroup
	}
	var packEnd, itemEnd int64
	for jc := 0; jc < n; jc += pl.nc {
		ncur := min(pl.nc, n-jc)
		np := (ncur + nr - 1) / nr
		chunksPerStep := (np + pl.packGroup - 1) / pl.packGroup
		packBase := packEnd
		packEnd += int64(kb * (chunksPerStep + aChunksPerStep))
		for {
			idx, ok := claim(&pl.packNext, packEnd)
			if !ok {
				break
			}
			i := int(idx - packBase)
			if i < kb*chunksPerStep {
				step, g := i/chunksPerStep, i%chunksPerStep
				pc := step * kc
				kcur := min(kc, k-pc)
				kw := kern.words(kcur)
				jp0, jp1 := g*pl.packGroup, min(np, (g+1)*pl.packGroup)
				off := kern.words(pc) * np * nr
				pl.packB(bb[off+jp0*kw*nr:off+jp1*kw*nr], pc, kcur, jc+jp0*nr, min(jp1*nr, ncur)-jp0*nr)
			} else {
				i -= kb * chunksPerStep
				step, g := i/aChunksPerStep, i%aChunksPerStep
				pc := step * kc
				kcur := min(kc, k-pc)
				kw := kern.words(kcur)
				ib0, ib1 := g*pl.packGroup, min(mb, (g+1)*pl.packGroup)
				off := kern.words(pc) * mb * mr
				pl.packA(pl.apk.f[off+ib0*mr*kw:off+ib1*mr*kw], ib0*mr, min(ib1*mr, pl.m)-ib0*mr, pc, kcur)
			}
			pl.done(&pl.packDone, packEnd)
		}
		aChunksPerStep = 0 // A is packed once
		pl.waitFor(&pl.packDone, packEnd)

		itemBase := itemEnd
		itemEnd += int64(pl.rowBlocks * pl.colGroups)
		for {
			idx, ok := claim(&pl.itemNext, itemEnd)
			if !ok {
				break
			}
			rb, cg := int(idx-itemBase)/pl.colGroups, int(idx-itemBase)%pl.colGroups
			pl.item(abuf, tile, rb, cg, jc, ncur)
			pl.done(&pl.itemDone, itemEnd)
		}
		if jc+pl.nc < n {
			// The next block repacks bb: wait until nobody reads it.
			pl.waitFor(&pl.itemDone, itemEnd)
		}
	}
}

// item computes the tiles of C in row block rb and panel group cg of the
// N block of ncur columns at jc. abuf is the worker's A buffer, unused
// when A is packed whole. For a bfloat16 C, the item accumulates every K
// step in the worker's float32 tile (which first holds the widened C
// when beta != 0) and rounds it into C to nearest even once, after the
// last: the bits of the float32 C's result, rounded.
func (pl *plan) item(abuf, tile []float32, rb, cg, jc, ncur int) {
	kern := pl.kern
	mr, nr := kern.mr, kern.nr
	mb := (pl.m + mr - 1) / mr
	r0 := rb * mb / pl.rowBlocks * mr
	r1 := min(pl.m, (rb+1)*mb/pl.rowBlocks*mr)
	np := (ncur + nr - 1) / nr
	q0, q1 := cg*np/pl.colGroups, (cg+1)*np/pl.colGroups
	if r0 >= r1 || q0 >= q1 {
		return
	}
	rows := r1 - r0
	bb := pl.bbuf.f
	// dst is C from row r0 and column j0 on, with row stride ld: C
	// itself, or the tile of a bfloat16 C.
	j0 := jc + q0*nr
	width := min(jc+q1*nr, jc+ncur) - j0
	var dst []float32
	ld := pl.ldc
	if pl.ch == nil {
		dst = pl.c[r0*pl.ldc+j0:]
	} else {
		ld = (q1 - q0) * nr
		dst = tile[:rows*ld]
		if pl.beta != 0 {
			for i := 0; i < rows; i++ {
				numeric.BF16sToFloat32(dst[i*ld:i*ld+width], pl.ch[(r0+i)*pl.ldc+j0:(r0+i)*pl.ldc+j0+width])
			}
		}
	}
	for pc := 0; pc < pl.k; pc += pl.kc {
		kcur := min(pl.kc, pl.k-pc)
		kw := kern.words(kcur)
		if pl.apk != nil {
			off := kern.words(pc)*mb*mr + r0*kw
			abuf = pl.apk.f[off : off+roundUp(rows, mr)*kw]
		} else {
			pl.packA(abuf, r0, rows, pc, kcur)
		}
		beta := pl.beta
		if pc > 0 {
			beta = 1
		}
		off := kern.words(pc) * np * nr
		for jp := q0; jp < q1; jp++ {
			j := (jp - q0) * nr
			cols := min(nr, width-j)
			bp := bb[off+jp*kw*nr : off+(jp+1)*kw*nr]
			for ir := 0; ir < rows; ir += mr {
				kern.micro(kw, abuf[ir*kw:(ir+mr)*kw], bp, dst[ir*ld+j:],
					ld, pl.alpha, beta, min(mr, rows-ir), cols)
			}
		}
	}
	if pl.ch != nil {
		for i := 0; i < rows; i++ {
			numeric.Float32sToBF16(pl.ch[(r0+i)*pl.ldc+j0:(r0+i)*pl.ldc+j0+width], dst[i*ld:i*ld+width])
		}
	}
}

// claim takes the next index of ctr if it is below end.
func claim(ctr *paddedCounter, end int64) (int64, bool) {
	for {
		cur := ctr.Load()
		if cur >= end {
			return 0, false
		}
		if ctr.CompareAndSwap(cur, cur+1) {
			return cur, true
		}
	}
}

// waitSpins is how many times waitFor polls a counter before it sleeps
// on pl.wake (about 10-20 µs, longer than a balanced wait for a packing
// chunk). On a machine with more runnable threads than cores, the worker
// being waited for can be descheduled for a whole time slice: a sleeping
// waiter gives it the core, where runtime.Gosched kept the thread busy in
// the scheduler (27% of the samples of a bf16 step on a loaded machine).
// A variable so that tests can make every wait sleep.
var waitSpins = 1 << 14

// done counts one unit of work on ctr, waking the waiters of pl when the
// count reaches end.
func (pl *plan) done(ctr *paddedCounter, end int64) {
	if ctr.Add(1) == end {
		pl.mu.Lock()
		pl.wake.Broadcast()
		pl.mu.Unlock()
	}
}

// waitFor returns once ctr reaches target (counted with done).
func (pl *plan) waitFor(ctr *paddedCounter, target int64) {
	for spin := 0; spin < waitSpins; spin++ {
		if ctr.Load() >= target {
			return
		}
	}
	pl.mu.Lock()
	for ctr.Load() < target {
		pl.wake.Wait()
	}
	pl.mu.Unlock()
}

// packA packs rows [i0, i0+rows) and columns [p0, p0+kc) of op(A) into
// mr-row micro-panels in dst.
func (pl *plan) packA(dst []float32, i0, rows, p0, kc int) {
	kern := pl.kern
	mr := kern.mr
	if pl.ah != nil {
		kw := kern.words(kc)
		if pl.transA {
			kern.copyPackBF16(dst, pl.ah[p0*pl.lda+i0:], pl.lda, mr, kc, rows)
			return
		}
		for ir := 0; ir < rows; ir += mr {
			kern.transPackBF16(dst[ir*kw:(ir+mr)*kw], pl.ah[(i0+ir)*pl.lda+p0:], pl.lda, min(mr, rows-ir), mr, kc)
		}
		return
	}
	if pl.transA {
		kern.copyPack(dst, pl.a[p0*pl.lda+i0:], pl.lda, mr, kc, rows)
		return
	}
	kw := kern.words(kc)
	for ir := 0; ir < rows; ir += mr {
		kern.transPack(dst[ir*kw:(ir+mr)*kw], pl.a[(i0+ir)*pl.lda+p0:], pl.lda, min(mr, rows-ir), mr, kc)
	}
}

// packB packs rows [p0, p0+kc) and columns [j0, j0+cols) of op(B) into
// nr-column micro-panels in dst.
func (pl *plan) packB(dst []float32, p0, kc, j0, cols int) {
	kern := pl.kern
	nr := kern.nr
	kw := kern.words(kc)
	if pl.bh != nil {
		if !pl.transB {
			kern.copyPackBF16(dst, pl.bh[p0*pl.ldb+j0:], pl.ldb, nr, kc, cols)
			return
		}
		for jr := 0; jr < cols; jr += nr {
			kern.transPackBF16(dst[jr*kw:(jr+nr)*kw], pl.bh[(j0+jr)*pl.ldb+p0:], pl.ldb, min(nr, cols-jr), nr, kc)
		}
		return
	}
	if !pl.transB {
		kern.copyPack(dst, pl.b[p0*pl.ldb+j0:], pl.ldb, nr, kc, cols)
		return
	}
	for jr := 0; jr < cols; jr += nr {
		kern.transPack(dst[jr*kw:(jr+nr)*kw], pl.b[(j0+jr)*pl.ldb+p0:], pl.ldb, min(nr, cols-jr), nr, kc)
	}
}

// A buffer is a reusable float32 slice starting on a 64-byte boundary.
type buffer struct {
	raw []float32
	f   []float32
}

// Pools of packed A and B buffers and of the tiles of a bfloat16 C, kept
// apart so that the small A buffers do not grow to the size of B panels.
var (
	aPool = sync.Pool{New: func() any { return new(buffer) }}
	bPool = sync.Pool{New: func() any { return new(buffer) }}
	cPool = sync.Pool{New: func() any { return new(buffer) }}
)

// getBuffer returns a buffer from pool with len(f) >= n.
func getBuffer(pool *sync.Pool, n int) *buffer {
	b := pool.Get().(*buffer)
	if len(b.f) < n {
		b.raw = make([]float32, n+16)
		off := int((64-uintptr(unsafe.Pointer(&b.raw[0]))%64)%64) / 4
		b.f = b.raw[off : off+n]
	}
	return b
}
