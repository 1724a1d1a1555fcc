package cpu

import (
	"fmt"
	"math"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/numeric"
)

// Cross-entropy statistics: three float32 per row.
const (
	ceMax    = 0 // running maximum logit
	ceSum    = 1 // sum of exp(logit - running maximum)
	ceTarget = 2 // the target's logit, NaN until its chunk is seen
	ceStride = 3
)

// ceGrain is the number of rows per worker share in the cross-entropy
// loops, which cost a few nanoseconds per logit.
func ceGrain(v int) int { return max(1, 4096/max(v, 1)) }

// ceLogits are a chunk of logits [N, V]: float32, or bfloat16 (mixed
// precision's output layer writes them so, as PyTorch's bfloat16 output
// projection), whose rows the loss reads widened into a float32 row
// buffer and computes on exactly as on float32 ones.
type ceLogits struct {
	f32 []float32
	h   []uint16
	V   int
}

// ceLogitsOf returns the N×V logits of t.
func ceLogitsOf(op string, t backend.Tensor, N, V int) ceLogits {
	if isBF16(t) {
		return ceLogits{h: u16n(op, "logits", t, N*V), V: V}
	}
	return ceLogits{f32: f32n(op, "logits", t, N*V), V: V}
}

// forRows calls fn over blocks of rows [lo, hi) of N, on the pool's
// workers; buf is the worker's row buffer for bfloat16 logits (its
// scratch, nil for float32 logits, which are read in place).
func (l ceLogits) forRows(b *Backend, N int, fn func(lo, hi int, buf []float32)) {
	grain := ceGrain(l.V)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.forItems((N+grain-1)/grain, func(w, it int) {
		var buf []float32
		if l.h != nil {
			buf = b.workerScratch(w, l.V)
		}
		lo := it * grain
		fn(lo, min(N, lo+grain), buf)
	})
}

// row returns row i as float32: the logits' own, or widened into buf.
func (l ceLogits) row(i int, buf []float32) []float32 {
	if l.h == nil {
		return l.f32[i*l.V : (i+1)*l.V]
	}
	r := buf[:l.V]
	numeric.BF16sToFloat32(r, l.h[i*l.V:(i+1)*l.V])
	return r
}

// store writes row i back after it was overwritten (its float32 row in
// place already): rounded to nearest even into bfloat16 logits.
func (l ceLogits) store(i int, row []float32) {
	if l.h != nil {
		numeric.Float32sToBF16(l.h[i*l.V:(i+1)*l.V], row)
	}
}

// clearRow zeroes row i.
func (l ceLogits) clearRow(i int) {
	if l.h != nil {
		clear(l.h[i*l.V : (i+1)*l.V])
		return
	}
	clear(l.f32[i*l.V : (i+1)*l.V])
}

// CrossEntropyReset sets every row of stats [N, 3] to (-Inf, 0, NaN): no
// logits seen, and no target logit yet. A target that no chunk covers
// therefore yields a NaN loss rather than a silently wrong one.
func (b *Backend) CrossEntropyReset(stats backend.Tensor, N int) {
	st := f32n("CrossEntropyReset", "stats", stats, N*ceStride)
	inf, nan := float32(math.Inf(-1)), float32(math.NaN())
	for i := 0; i < N; i++ {
		s := st[i*ceStride : i*ceStride+ceStride]
		s[ceMax], s[ceSum], s[ceTarget] = inf, 0, nan
	}
}

// CrossEntropyChunk folds logits [N, V], columns vOff..vOff+V of the
// vocabulary, into the running (max, sum, target logit) of every row whose
// target is not negative. Each row is one worker's, so the result does not
// depend on the thread count. Bfloat16 logits are widened exactly: the
// statistics are those of their float32 values.
func (b *Backend) CrossEntropyChunk(stats, logits, targets backend.Tensor, N, V, vOff int) {
	const op = "CrossEntropyChunk"
	if V <= 0 || vOff < 0 {
		panic(fmt.Sprintf("cpu: %s: bad chunk V=%d vOff=%d", op, V, vOff))
	}
	st := f32n(op, "stats", stats, N*ceStride)
	lg := ceLogitsOf(op, logits, N, V)
	tg := i32n(op, "targets", targets, N)
	lg.forRows(b, N, func(lo, hi int, buf []float32) {
		for i := lo; i < hi; i++ {
			t := int(tg[i])
			if t < 0 {
				continue
			}
			row := lg.row(i, buf)
			s := st[i*ceStride : i*ceStride+ceStride]
			m := rowMax(row)
			mOld := s[ceMax]
			if mOld > m {
				m = mOld
			}
			if m > float32(math.Inf(-1)) {
				// expf(-Inf) is 0, so the first chunk needs no special case.
				s[ceSum] = s[ceSum]*expf(mOld-m) + sumExpShift(row, m)
				s[ceMax] = m
			}
			if t >= vOff && t < vOff+V {
				s[ceTarget] = row[t-vOff]
			}
		}
	})
}

// CrossEntropyLoss writes losses[i] = max + log(sum) - target logit from
// completed stats, and 0 for rows whose target is negative.
func (b *Backend) CrossEntropyLoss(losses, stats, targets backend.Tensor, N int) {
	const op = "CrossEntropyLoss"
	l := f32n(op, "losses", losses, N)
	st := f32n(op, "stats", stats, N*ceStride)
	tg := i32n(op, "targets", targets, N)
	for i := range l {
		if tg[i] < 0 {
			l[i] = 0
			continue
		}
		s := st[i*ceStride : i*ceStride+ceStride]
		l[i] = float32(float64(s[ceMax]) + math.Log(float64(s[ceSum])) - float64(s[ceTarget]))
	}
}

// CrossEntropyChunkBackward overwrites the chunk logits [N, V] at vOff
// with scale * (softmax - onehot(target)) from completed stats; rows whose
// target is negative become zero. Bfloat16 logits get the gradient of
// their widened values rounded to nearest even (PyTorch's bfloat16
// logits gradient).
func (b *Backend) CrossEntropyChunkBackward(logits, stats, targets backend.Tensor, N, V, vOff int, scale float32) {
	const op = "CrossEntropyChunkBackward"
	if V <= 0 || vOff < 0 {
		panic(fmt.Sprintf("cpu: %s: bad chunk V=%d vOff=%d", op, V, vOff))
	}
	lg := ceLogitsOf(op, logits, N, V)
	st := f32n(op, "stats", stats, N*ceStride)
	tg := i32n(op, "targets", targets, N)
	lg.forRows(b, N, func(lo, hi int, buf []float32) {
		for i := lo; i < hi; i++ {
			t := int(tg[i])
			if t < 0 {
				lg.clearRow(i)
				continue
			}
			row := lg.row(i, buf)
			s := st[i*ceStride : i*ceStride+ceStride]
			expShiftSum(row, s[ceMax])
			mul := scale / s[ceSum]
			for j := range row {
				row[j] *= mul
			}
			if t >= vOff && t < vOff+V {
				row[t-vOff] -= scale
			}
			lg.store(i, row)
		}
	})
}
