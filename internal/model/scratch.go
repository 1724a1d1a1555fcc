package model

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
)

// HostScratch is host memory that the parts of one rank share for
// transient staging, such as the send and receive buffers of a part's
// collectives: a rank's parts (one per microbatch in flight, and per
// pipeline stage) never compute at the same time, so one buffer of each
// kind serves them all. A nil *HostScratch gives every caller its own
// buffers.
type HostScratch struct {
	bufs map[string][]float32
}

// Float32s returns n elements of the buffer named name, allocated on
// first use; a request for more elements than the buffer has replaces it
// with a larger one (callers holding the old one keep it).
func (h *HostScratch) Float32s(name string, n int) []float32 {
	if h == nil {
		return make([]float32, n)
	}
	b := h.bufs[name]
	if len(b) < n {
		if h.bufs == nil {
			h.bufs = map[string][]float32{}
		}
		b = make([]float32, n)
		h.bufs[name] = b
	}
	return b[:n:n]
}

// SplitPool is the memory a stage's split backwards keep from a
// BackwardInput to its BackwardWeight, which the stage's activation sets
// share: a zero-bubble schedule has fewer microbatches between the two
// halves at once than activation sets (pipeline.Schedule.ActivationSets),
// so a set takes a buffer for that span rather than holding one. The
// buffers are whatever the parts of one shape make; a nil pool is a
// part's own.
type SplitPool struct {
	free  []any
	made  int
	bytes int64
}

// Get takes a free buffer; ok is false when none is free.
func (p *SplitPool) Get() (b any, ok bool) {
	if len(p.free) == 0 {
		return nil, false
	}
	b = p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return b, true
}

// Put returns buffer b, taken with Get or made by the caller (Made), to
// the pool.
func (p *SplitPool) Put(b any) { p.free = append(p.free, b) }

// Made counts a buffer of the given size that a caller made for the pool.
func (p *SplitPool) Made(bytes int64) { p.made, p.bytes = p.made+1, p.bytes+bytes }

// Len is the number of buffers made for the pool, Bytes their size.
func (p *SplitPool) Len() int     { return p.made }
func (p *SplitPool) Bytes() int64 { return p.bytes }

// ActivationScratch is device memory that the activation sets of a rank
// (one per microbatch in flight, of each of its pipeline stages) share
// for what a pass needs only while it runs: forward temporaries,
// recomputation buffers, backward buffers and activation gradients. A
// rank runs one forward or backward at a time, so one copy serves every
// set; what a microbatch keeps between its forward and its backward stays
// in each set. Parts of different shapes (the stages of a rank) share it
// when it was sized for the largest first (Reserve, from a ScratchSizer);
// otherwise the first part to ask sizes it. A part that finds it holding
// the state of another part's pass (see Claim) treats it as overwritten.
type ActivationScratch struct {
	n, nh     int // reserved elements (Reserve)
	buf, bufH backend.Tensor
	taken     bool
	last      any
}

// Reserve makes the scratch hold at least n float32s and nh bfloat16s
// once allocated; it must be called before the first Take.
func (s *ActivationScratch) Reserve(n, nh int) {
	s.n, s.nh = max(s.n, n), max(s.nh, nh)
}

// Take returns n float32s and nh bfloat16s of the scratch on be,
// allocating it on the first call (the larger of what Reserve asked and
// this call's sizes); a later call may ask for no more than that.
func (s *ActivationScratch) Take(be backend.Backend, n, nh int) (f32, bf16 backend.Tensor, err error) {
	if !s.taken {
		s.taken = true
		s.buf = be.Alloc(backend.Float32, max(s.n, n))
		if m := max(s.nh, nh); m > 0 {
			s.bufH = be.Alloc(backend.BFloat16, m)
		}
	}
	if n > s.buf.Len || nh > s.bufH.Len {
		return backend.Tensor{}, backend.Tensor{}, fmt.Errorf("model: activation scratch of %d float32 and %d bfloat16 elements asked for %d and %d", s.buf.Len, s.bufH.Len, n, nh)
	}
	f32 = s.buf.Slice(0, n)
	if nh > 0 {
		bf16 = s.bufH.Slice(0, nh)
	}
	return f32, bf16, nil
}

// Bytes is the scratch's allocated size.
func (s *ActivationScratch) Bytes() int64 { return int64(s.buf.Len)*4 + int64(s.bufH.Len)*2 }

// Claim records that part p runs a pass on the scratch now and reports
// whether p ran the previous one too (so that what p's last pass left in
// the scratch is still there).
func (s *ActivationScratch) Claim(p any) bool {
	same := s.last == p
	s.last = p
	return same
}
