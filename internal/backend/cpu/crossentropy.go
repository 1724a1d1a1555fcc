package cpu

import (
	"fmt"
	"math"

	"github.com/titan-go/titan/internal/backend"
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
// depend on the thread count.
func (b *Backend) CrossEntropyChunk(stats, logits, targets backend.Tensor, N, V, vOff int) {
	const op = "CrossEntropyChunk"
	if V <= 0 || vOff < 0 {
		panic(fmt.Sprintf("cpu: %s: bad chunk V=%d vOff=%d", op, V, vOff))
	}
	st := f32n(op, "stats", stats, N*ceStride)
	lg := f32n(op, "logits", logits, N*V)
	tg := i32n(op, "targets", targets, N)
	b.pool.For(N, ceGrain(V), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			t := int(tg[i])
			if t < 0 {
				continue
			}
			row := lg[i*V : (i+1)*V]
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
// target is negative become zero.
func (b *Backend) CrossEntropyChunkBackward(logits, stats, targets backend.Tensor, N, V, vOff int, scale float32) {
	const op = "CrossEntropyChunkBackward"
	if V <= 0 || vOff < 0 {
		panic(fmt.Sprintf("cpu: %s: bad chunk V=%d vOff=%d", op, V, vOff))
	}
	lg := f32n(op, "logits", logits, N*V)
	st := f32n(op, "stats", stats, N*ceStride)
	tg := i32n(op, "targets", targets, N)
	b.pool.For(N, ceGrain(V), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row := lg[i*V : (i+1)*V]
			t := int(tg[i])
			if t < 0 {
				clear(row)
				continue
			}
			s := st[i*ceStride : i*ceStride+ceStride]
			expShiftSum(row, s[ceMax])
			mul := scale / s[ceSum]
			for j := range row {
				row[j] *= mul
			}
			if t >= vOff && t < vOff+V {
				row[t-vOff] -= scale
			}
		}
	})
}
