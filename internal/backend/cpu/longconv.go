package cpu

import (
	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/longconv"
)

var _ backend.LongConv = (*Backend)(nil)

// conv returns the longconv options that run on b's workers.
func (b *Backend) conv() longconv.Conv {
	return longconv.Conv{Threads: b.pool.Size(), Runner: b.pool}
}

// CausalConv computes y[b,c,t] = Σ_{s≤t} h[c][t-s]·x[b,c,s] with package
// longconv (direct for short sequences, FFT for long ones); x, y are
// [B, C, L] and h is [C, L]. Each (batch, channel) row is computed by one
// worker, so the result does not depend on the thread count.
func (b *Backend) CausalConv(y, x, h backend.Tensor, B, C, L int) {
	const op = "CausalConv"
	n := B * C * L
	b.conv().Forward(f32n(op, "y", y, n), f32n(op, "x", x, n), f32n(op, "h", h, C*L), B, C, L)
}

// CausalConvBackward accumulates the gradients of CausalConv into dx
// ([B, C, L]) and dh ([C, L]); a zero Tensor skips that gradient.
func (b *Backend) CausalConvBackward(dx, dh, dy, x, h backend.Tensor, B, C, L int) {
	const op = "CausalConvBackward"
	n := B * C * L
	var dxs, dhs []float32
	if dx.Len > 0 {
		dxs = f32n(op, "dx", dx, n)
	}
	if dh.Len > 0 {
		dhs = f32n(op, "dh", dh, C*L)
	}
	b.conv().Backward(dxs, dhs, f32n(op, "dy", dy, n), f32n(op, "x", x, n), f32n(op, "h", h, C*L), B, C, L)
}
