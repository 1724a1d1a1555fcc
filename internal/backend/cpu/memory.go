package cpu

import (
	"fmt"
	"unsafe"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/numeric"
)

// align is the byte alignment of every allocation (one cache line, one
// AVX-512 register).
const align = 64

// alignedSlice returns a zeroed slice of n elements of T whose first
// element sits on an align-byte boundary.
func alignedSlice[T any](n int) []T {
	var zero T
	size := int(unsafe.Sizeof(zero))
	extra := align / size
	buf := make([]T, n+extra)
	if n == 0 {
		return buf[:0:0]
	}
	addr := uintptr(unsafe.Pointer(&buf[0]))
	off := 0
	if r := int(addr % align); r != 0 {
		off = (align - r) / size
	}
	return buf[off : off+n : off+n]
}

// Alloc returns n zeroed elements of dtype, 64-byte aligned. The memory's
// Host field is a []float32, []uint16 (bfloat16 bit patterns) or []int32.
func (b *Backend) Alloc(dtype backend.DType, n int) backend.Tensor {
	if n < 0 {
		panic(fmt.Sprintf("cpu: Alloc of %d %s elements", n, dtype))
	}
	m := &backend.Memory{DType: dtype, Len: n}
	switch dtype {
	case backend.Float32:
		m.Host = alignedSlice[float32](n)
	case backend.BFloat16:
		m.Host = alignedSlice[uint16](n)
	case backend.Int32:
		m.Host = alignedSlice[int32](n)
	default:
		panic(fmt.Sprintf("cpu: Alloc of unsupported dtype %s", dtype))
	}
	return backend.Tensor{Mem: m, Off: 0, Len: n}
}

// checkView panics unless t is a valid view of host memory of dtype.
func checkView(op, name string, t backend.Tensor, dtype backend.DType) {
	if t.Mem == nil {
		if t.Len != 0 || t.Off != 0 {
			panic(fmt.Sprintf("cpu: %s: %s has no memory but Off=%d Len=%d", op, name, t.Off, t.Len))
		}
		return
	}
	if t.Mem.DType != dtype {
		panic(fmt.Sprintf("cpu: %s: %s is %s, want %s", op, name, t.Mem.DType, dtype))
	}
	if t.Off < 0 || t.Len < 0 || t.Off+t.Len > t.Mem.Len {
		panic(fmt.Sprintf("cpu: %s: %s view [%d:%d] outside its %d-element memory", op, name, t.Off, t.Off+t.Len, t.Mem.Len))
	}
}

// view returns the elements of t, a tensor of dtype held as []T by the
// cpu backend. op and name identify the operation and argument in the
// panic raised for any other dtype or memory.
func view[T float32 | uint16 | int32](op, name string, t backend.Tensor, dtype backend.DType) []T {
	checkView(op, name, t, dtype)
	if t.Mem == nil {
		return nil
	}
	h, ok := t.Mem.Host.([]T)
	if !ok {
		panic(fmt.Sprintf("cpu: %s: %s is %s memory not owned by the cpu backend (Host is %T)", op, name, dtype, t.Mem.Host))
	}
	return h[t.Off : t.Off+t.Len : t.Off+t.Len]
}

// viewN is view of the first n elements, panicking if t holds fewer.
func viewN[T float32 | uint16 | int32](op, name string, t backend.Tensor, dtype backend.DType, n int) []T {
	x := view[T](op, name, t, dtype)
	if n < 0 || len(x) < n {
		panic(fmt.Sprintf("cpu: %s: %s has %d elements, need %d", op, name, len(x), n))
	}
	return x[:n:n]
}

// f32 returns the elements of the float32 tensor t.
func f32(op, name string, t backend.Tensor) []float32 {
	return view[float32](op, name, t, backend.Float32)
}

// u16 returns the bit patterns of the bfloat16 tensor t.
func u16(op, name string, t backend.Tensor) []uint16 {
	return view[uint16](op, name, t, backend.BFloat16)
}

// i32 returns the elements of the int32 tensor t.
func i32(op, name string, t backend.Tensor) []int32 { return view[int32](op, name, t, backend.Int32) }

// f32n returns the first n elements of the float32 tensor t.
func f32n(op, name string, t backend.Tensor, n int) []float32 {
	return viewN[float32](op, name, t, backend.Float32, n)
}

// u16n returns the first n bit patterns of the bfloat16 tensor t.
func u16n(op, name string, t backend.Tensor, n int) []uint16 {
	return viewN[uint16](op, name, t, backend.BFloat16, n)
}

// i32n returns the first n elements of the int32 tensor t.
func i32n(op, name string, t backend.Tensor, n int) []int32 {
	return viewN[int32](op, name, t, backend.Int32, n)
}

// Upload copies src, a []float32, []int32 or (bfloat16 bit patterns)
// []uint16 matching dst's dtype and exactly dst.Len long, into dst; a
// []float32 into a bfloat16 dst is rounded to nearest even.
func (b *Backend) Upload(dst backend.Tensor, src any) {
	const op = "Upload"
	switch s := src.(type) {
	case []float32:
		if isBF16(dst) {
			d := u16(op, "dst", dst)
			checkHostLen(op, len(s), len(d))
			numeric.Float32sToBF16(d, s)
			return
		}
		d := f32(op, "dst", dst)
		checkHostLen(op, len(s), len(d))
		copy(d, s)
	case []int32:
		d := i32(op, "dst", dst)
		checkHostLen(op, len(s), len(d))
		copy(d, s)
	case []uint16:
		d := u16(op, "dst", dst)
		checkHostLen(op, len(s), len(d))
		copy(d, s)
	default:
		panic(fmt.Sprintf("cpu: Upload: unsupported host type %T", src))
	}
}

// Download copies src into dst, a []float32, []int32 or []uint16 matching
// src's dtype and exactly src.Len long; a bfloat16 src into a []float32
// is widened exactly.
func (b *Backend) Download(dst any, src backend.Tensor) {
	const op = "Download"
	switch d := dst.(type) {
	case []float32:
		if isBF16(src) {
			s := u16(op, "src", src)
			checkHostLen(op, len(d), len(s))
			numeric.BF16sToFloat32(d, s)
			return
		}
		s := f32(op, "src", src)
		checkHostLen(op, len(d), len(s))
		copy(d, s)
	case []int32:
		s := i32(op, "src", src)
		checkHostLen(op, len(d), len(s))
		copy(d, s)
	case []uint16:
		s := u16(op, "src", src)
		checkHostLen(op, len(d), len(s))
		copy(d, s)
	default:
		panic(fmt.Sprintf("cpu: Download: unsupported host type %T", dst))
	}
}

// checkHostLen panics unless a host slice and a tensor have equal lengths.
func checkHostLen(op string, host, tensor int) {
	if host != tensor {
		panic(fmt.Sprintf("cpu: %s: host slice has %d elements, tensor %d", op, host, tensor))
	}
}

// Zero sets every element of t, of any dtype, to zero.
func (b *Backend) Zero(t backend.Tensor) {
	if t.Mem == nil {
		checkView("Zero", "t", t, 0)
		return
	}
	switch t.Mem.DType {
	case backend.Float32:
		x := f32("Zero", "t", t)
		b.pool.For(len(x), elemGrain, func(lo, hi int) { clear(x[lo:hi]) })
	case backend.Int32:
		clear(i32("Zero", "t", t))
	case backend.BFloat16:
		clear(u16("Zero", "t", t))
	default:
		panic(fmt.Sprintf("cpu: Zero: unsupported dtype %s", t.Mem.DType))
	}
}

// Copy copies src into dst; both must have the same dtype and length, and
// they must not partly overlap.
func (b *Backend) Copy(dst, src backend.Tensor) {
	const op = "Copy"
	if dst.Len != src.Len {
		panic(fmt.Sprintf("cpu: Copy: dst has %d elements, src %d", dst.Len, src.Len))
	}
	if dst.Len == 0 {
		return
	}
	if dst.Mem != nil && src.Mem != nil && dst.Mem.DType == backend.BFloat16 && src.Mem.DType == backend.Float32 {
		d, s := u16(op, "dst", dst), f32(op, "src", src)
		b.pool.For(len(d), elemGrain, func(lo, hi int) { numeric.Float32sToBF16(d[lo:hi], s[lo:hi]) })
		return
	}
	if dst.Mem == nil || src.Mem == nil || dst.Mem.DType != src.Mem.DType {
		panic(fmt.Sprintf("cpu: Copy: dtype mismatch (dst %v, src %v)", dtypeOf(dst), dtypeOf(src)))
	}
	switch dst.Mem.DType {
	case backend.Float32:
		d, s := f32(op, "dst", dst), f32(op, "src", src)
		b.pool.For(len(d), elemGrain, func(lo, hi int) { copy(d[lo:hi], s[lo:hi]) })
	case backend.Int32:
		copy(i32(op, "dst", dst), i32(op, "src", src))
	case backend.BFloat16:
		copy(u16(op, "dst", dst), u16(op, "src", src))
	default:
		panic(fmt.Sprintf("cpu: Copy: unsupported dtype %s", dst.Mem.DType))
	}
}

// dtypeOf names t's dtype, or "none" for a tensor without memory.
func dtypeOf(t backend.Tensor) string {
	if t.Mem == nil {
		return "none"
	}
	return t.Mem.DType.String()
}
