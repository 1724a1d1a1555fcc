package cuda

import (
	"fmt"
	"unsafe"

	"github.com/titan-go/titan/internal/backend"
)

var _ backend.LongConv = (*Backend)(nil)

// CausalConv computes y[b,c,t] = Σ_{s≤t} h[c][t-s]·x[b,c,s] (direct
// convolution on the device).
func (b *Backend) CausalConv(y, x, h backend.Tensor, B, C, L int) {
	const op = "CausalConv"
	n := B * C * L
	b.launch(op, "causal_conv_fwd", elemGrid(n), Dim3{elemBlock, 1, 1}, f32p(op, "y", y, n), f32p(op, "x", x, n),
		f32p(op, "h", h, C*L), int32(B), int32(C), int32(L))
}

// CausalConvBackward accumulates dx and dh; an empty one is skipped.
func (b *Backend) CausalConvBackward(dx, dh, dy, x, h backend.Tensor, B, C, L int) {
	const op = "CausalConvBackward"
	n := B * C * L
	if dx.Len > 0 {
		b.launch(op, "causal_conv_bwd_dx", elemGrid(n), Dim3{elemBlock, 1, 1}, f32p(op, "dx", dx, n), f32p(op, "dy", dy, n),
			f32p(op, "h", h, C*L), int32(B), int32(C), int32(L))
	}
	if dh.Len > 0 {
		b.launch(op, "causal_conv_bwd_dh", elemGrid(C*L), Dim3{elemBlock, 1, 1}, f32p(op, "dh", dh, C*L), f32p(op, "dy", dy, n),
			f32p(op, "x", x, n), int32(B), int32(C), int32(L))
	}
}

// Bytes is untyped device memory (float8 tensors, which backend.DType
// does not name yet).
type Bytes struct {
	Addr uintptr
	Len  int
}

// AllocBytes returns n zeroed bytes of device memory, which the caller
// frees with FreeBytes.
func (b *Backend) AllocBytes(n int) Bytes {
	p, err := b.dev.Malloc(n)
	b.must("AllocBytes", err)
	b.must("AllocBytes", b.dev.Memset(p, n))
	return Bytes{Addr: p, Len: n}
}

// FreeBytes frees memory from AllocBytes.
func (b *Backend) FreeBytes(x Bytes) { b.must("FreeBytes", b.dev.Free(x.Addr)) }

// DownloadBytes copies x to the host.
func (b *Backend) DownloadBytes(dst []byte, x Bytes) {
	if len(dst) != x.Len {
		panic(fmt.Sprintf("cuda: DownloadBytes: host has %d bytes, device %d", len(dst), x.Len))
	}
	if x.Len > 0 {
		b.must("DownloadBytes", b.dev.CopyDtoH(unsafe.Pointer(&dst[0]), x.Addr, x.Len))
	}
}

// FP8 formats.
const (
	E4M3 = 0 // float8 e4m3fn: no infinities, NaN 0x7f
	E5M2 = 1 // float8 e5m2: IEEE-like
)

// ToFP8 writes fp8(src·scale) into dst (src.Len bytes), rounding to
// nearest even as numeric.Float32ToE4M3/E5M2 (…Sat when sat).
func (b *Backend) ToFP8(dst Bytes, src backend.Tensor, format int, sat bool, scale float32) {
	const op = "ToFP8"
	n := src.Len
	if dst.Len < n {
		panic(fmt.Sprintf("cuda: %s: %d bytes for %d elements", op, dst.Len, n))
	}
	s := int32(0)
	if sat {
		s = 1
	}
	b.launch(op, "f32_to_fp8", elemGrid(n), Dim3{elemBlock, 1, 1}, dst.Addr, f32p(op, "src", src, n), int64(n), int32(format), s, scale)
}

// FromFP8 writes float(src)·scale into dst.
func (b *Backend) FromFP8(dst backend.Tensor, src Bytes, format int, scale float32) {
	const op = "FromFP8"
	n := dst.Len
	if src.Len < n {
		panic(fmt.Sprintf("cuda: %s: %d bytes for %d elements", op, src.Len, n))
	}
	b.launch(op, "fp8_to_f32", elemGrid(n), Dim3{elemBlock, 1, 1}, f32p(op, "dst", dst, n), src.Addr, int64(n), int32(format), scale)
}
