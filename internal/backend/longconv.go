package backend

// LongConv is an optional capability of a Backend: causal depthwise long
// convolutions, the sequence mixer of Hyena-style models. Callers test for
// it with a type assertion (lc, ok := b.(backend.LongConv)).
//
// x, y, dx and dy are [B, C, L] and h, dh are [C, L] (channel-major:
// each channel's sequence is contiguous, h[c][0] multiplies the current
// input). Like every Backend operation, CausalConv overwrites y and
// CausalConvBackward accumulates into dx and dh.
type LongConv interface {
	// CausalConv computes y[b,c,t] = Σ_{s≤t} h[c][t-s]·x[b,c,s].
	CausalConv(y, x, h Tensor, B, C, L int)
	// CausalConvBackward accumulates dx[b,c,s] += Σ_{t≥s} h[c][t-s]·dy[b,c,t]
	// and dh[c][k] += Σ_b Σ_t dy[b,c,t]·x[b,c,t-k]. A zero (empty) dx or dh
	// is skipped.
	CausalConvBackward(dx, dh, dy, x, h Tensor, B, C, L int)
}
