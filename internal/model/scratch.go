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

// ActivationScratch is device memory that the activation sets of one
// stage on a rank (one per microbatch in flight) share for what a pass
// needs only while it runs: forward temporaries, recomputation buffers,
// backward buffers and activation gradients. A rank runs one forward or
// backward at a time, so one copy serves every set; what a microbatch
// keeps between its forward and its backward stays in each set. The
// first part to ask allocates it; a part that finds it holding the
// state of another part's pass (see Claim) treats it as overwritten.
type ActivationScratch struct {
	buf, bufH backend.Tensor
	taken     bool
	last      any
}

// Take returns the scratch, n float32s and nh bfloat16s on be, allocating
// it on the first call; every later call must ask for the same sizes
// (the sets of one stage plan the same shapes).
func (s *ActivationScratch) Take(be backend.Backend, n, nh int) (f32, bf16 backend.Tensor, err error) {
	if !s.taken {
		s.taken = true
		s.buf = be.Alloc(backend.Float32, n)
		if nh > 0 {
			s.bufH = be.Alloc(backend.BFloat16, nh)
		}
	}
	if s.buf.Len != n || s.bufH.Len != nh {
		return backend.Tensor{}, backend.Tensor{}, fmt.Errorf("model: activation scratch of %d float32 and %d bfloat16 elements asked for %d and %d", s.buf.Len, s.bufH.Len, n, nh)
	}
	return s.buf, s.bufH, nil
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
