package comm

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/titan-go/titan/internal/numeric"
)

// DType is the element type of a Buffer.
type DType int

// Element types supported by every collective.
const (
	Float32 DType = iota
	Float64
	// BFloat16 elements are stored as uint16 (the upper half of a float32).
	// Reductions accumulate in float32 and round to nearest-even once, at
	// the end.
	BFloat16
	Int32
	Int64
)

// Size is the number of bytes one element occupies.
func (d DType) Size() int {
	switch d {
	case Float32, Int32:
		return 4
	case Float64, Int64:
		return 8
	case BFloat16:
		return 2
	}
	panic(fmt.Sprintf("comm: unknown dtype %d", int(d)))
}

func (d DType) valid() bool { return d >= Float32 && d <= Int64 }

func (d DType) isFloat() bool { return d == Float32 || d == Float64 || d == BFloat16 }

// String returns the lower-case name of d ("float32", "bfloat16", ...).
func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case BFloat16:
		return "bfloat16"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	}
	return fmt.Sprintf("dtype(%d)", int(d))
}

// ReduceOp is the element-wise reduction of AllReduce and ReduceScatter.
type ReduceOp int

// Reductions. Every reduction folds the contributions in group rank order,
// acc = x0; acc = acc ⊕ x1; ...; acc = acc ⊕ x(n-1), in the accumulation type
// of the element type (float32 for BFloat16, the element type otherwise).
// Integer sums and products wrap around.
const (
	Sum ReduceOp = iota
	Prod
	// Max and Min use Go's built-in max and min: a NaN operand gives NaN,
	// and max(-0, +0) is +0.
	Max
	Min
	// Avg is the Sum divided by the group size in the accumulation type.
	// It is defined for floating-point element types only.
	Avg
)

func (o ReduceOp) valid() bool { return o >= Sum && o <= Avg }

// String returns the lower-case name of o ("sum", "max", ...).
func (o ReduceOp) String() string {
	switch o {
	case Sum:
		return "sum"
	case Prod:
		return "prod"
	case Max:
		return "max"
	case Min:
		return "min"
	case Avg:
		return "avg"
	}
	return fmt.Sprintf("reduceop(%d)", int(o))
}

// Buffer is a typed view of a Go slice that collectives read and write.
// Build one with F32, F64, BF16, I32 or I64. A Buffer aliases the slice: a
// collective writes its results into the caller's memory, and the caller
// must not touch that memory until the collective (or its Work) completes.
type Buffer struct {
	dtype DType
	n     int
	b     []byte
}

func bytesOf[T any](x []T) []byte {
	if len(x) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), len(x)*int(unsafe.Sizeof(z)))
}

// F32 returns a Buffer over x.
func F32(x []float32) Buffer { return Buffer{Float32, len(x), bytesOf(x)} }

// F64 returns a Buffer over x.
func F64(x []float64) Buffer { return Buffer{Float64, len(x), bytesOf(x)} }

// BF16 returns a Buffer over x, whose elements are bfloat16 bit patterns.
func BF16(x []uint16) Buffer { return Buffer{BFloat16, len(x), bytesOf(x)} }

// I32 returns a Buffer over x.
func I32(x []int32) Buffer { return Buffer{Int32, len(x), bytesOf(x)} }

// I64 returns a Buffer over x.
func I64(x []int64) Buffer { return Buffer{Int64, len(x), bytesOf(x)} }

// DType returns the element type of b.
func (b Buffer) DType() DType { return b.dtype }

// Len returns the number of elements of b.
func (b Buffer) Len() int { return b.n }

// Slice returns the view of elements [lo, hi) of b.
func (b Buffer) Slice(lo, hi int) Buffer {
	if lo < 0 || hi < lo || hi > b.n {
		panic(fmt.Sprintf("comm: slice [%d:%d] out of range for buffer of %d elements", lo, hi, b.n))
	}
	es := b.dtype.Size()
	if b.b == nil {
		return Buffer{dtype: b.dtype}
	}
	return Buffer{b.dtype, hi - lo, b.b[lo*es : hi*es : hi*es]}
}

// bytes returns the bytes of elements [lo, hi).
func (b Buffer) bytes(lo, hi int) []byte {
	es := b.dtype.Size()
	if hi <= lo {
		return nil
	}
	return b.b[lo*es : hi*es : hi*es]
}

// BF16ToFloat32 widens a bfloat16 bit pattern exactly (numeric.BF16ToFloat32).
func BF16ToFloat32(h uint16) float32 { return numeric.BF16ToFloat32(h) }

// Float32ToBF16 rounds f to the nearest bfloat16, ties to even; NaNs stay
// NaN (numeric.Float32ToBF16).
func Float32ToBF16(f float32) uint16 { return numeric.Float32ToBF16(f) }

// ChunkBounds returns the element range [lo, hi) of chunk i when n elements
// are split into parts chunks: lo = i*n/parts, hi = (i+1)*n/parts. Chunks
// differ in length by at most one element, later chunks being the longer
// ones, and some chunks are empty when n < parts. ReduceScatter, AllGather
// and the default split of AllToAll use these bounds, and so should FSDP
// code that shards flat buffers.
func ChunkBounds(n, parts, i int) (lo, hi int) {
	if parts <= 0 || i < 0 || i >= parts || n < 0 {
		panic(fmt.Sprintf("comm: ChunkBounds(%d, %d, %d) out of range", n, parts, i))
	}
	return chunkAt(n, parts, i), chunkAt(n, parts, i+1)
}

func chunkAt(n, parts, i int) int {
	if n <= math.MaxInt32 {
		return int(int64(i) * int64(n) / int64(parts))
	}
	// i*n may overflow int64 only for absurd sizes; split the product.
	q, r := n/parts, n%parts
	return i*q + i*r/parts
}

// ChunkLen returns the length of chunk i of n elements split into parts.
func ChunkLen(n, parts, i int) int {
	lo, hi := ChunkBounds(n, parts, i)
	return hi - lo
}

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }
