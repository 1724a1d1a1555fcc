package model

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
