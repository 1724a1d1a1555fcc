package comm

import (
	"unsafe"
)

// foldBlock is the number of elements reduced per block; the accumulator of
// one block lives on the stack.
const foldBlock = 512

type number interface {
	~float32 | ~float64 | ~int32 | ~int64
}

func asSlice[T any](b []byte) []T {
	if len(b) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}

// fold writes into dst the reduction of srcs in order:
// dst[i] = ((srcs[0][i] ⊕ srcs[1][i]) ⊕ srcs[2][i]) ⊕ ... ; for Avg the sum
// is divided by len(srcs). Every src has len(dst) bytes. dst may be one of
// srcs (the same memory) but must not partially overlap any of them.
func fold(dt DType, op ReduceOp, dst []byte, srcs [][]byte) {
	switch dt {
	case Float32:
		foldNum(asSlice[float32](dst), typed[float32](srcs), op)
	case Float64:
		foldNum(asSlice[float64](dst), typed[float64](srcs), op)
	case Int32:
		foldNum(asSlice[int32](dst), typed[int32](srcs), op)
	case Int64:
		foldNum(asSlice[int64](dst), typed[int64](srcs), op)
	case BFloat16:
		foldBF16(asSlice[uint16](dst), typed[uint16](srcs), op)
	default:
		panic("comm: fold of unknown dtype")
	}
}

func typed[T any](srcs [][]byte) [][]T {
	out := make([][]T, len(srcs))
	for i, s := range srcs {
		out[i] = asSlice[T](s)
	}
	return out
}

func foldNum[T number](dst []T, srcs [][]T, op ReduceOp) {
	n, k := len(dst), len(srcs)
	var accArr [foldBlock]T
	for lo := 0; lo < n; lo += foldBlock {
		hi := min(lo+foldBlock, n)
		d := dst[lo:hi]
		switch k {
		case 1:
			copy(d, srcs[0][lo:hi])
		case 2:
			// d may be srcs[0] or srcs[1]: each element is read before
			// it is written.
			combine2(d, srcs[0][lo:hi], srcs[1][lo:hi], op)
		default:
			// The accumulator lives in L1; d is written last, so it may
			// alias any source.
			acc := accArr[:hi-lo]
			combine2(acc, srcs[0][lo:hi], srcs[1][lo:hi], op)
			for _, s := range srcs[2 : k-1] {
				combine(acc, s[lo:hi], op)
			}
			combine2(d, acc, srcs[k-1][lo:hi], op)
		}
		if op == Avg {
			div := T(k)
			for i := range d {
				d[i] /= div
			}
		}
	}
}

// combine2 sets d[i] = a[i] ⊕ b[i].
func combine2[T number](d, a, b []T, op ReduceOp) {
	a, b = a[:len(d)], b[:len(d)]
	switch op {
	case Sum, Avg:
		for i := range d {
			d[i] = a[i] + b[i]
		}
	case Prod:
		for i := range d {
			d[i] = a[i] * b[i]
		}
	case Max:
		for i := range d {
			d[i] = max(a[i], b[i])
		}
	case Min:
		for i := range d {
			d[i] = min(a[i], b[i])
		}
	}
}

func foldBF16(dst []uint16, srcs [][]uint16, op ReduceOp) {
	n := len(dst)
	var accArr, tmpArr [foldBlock]float32
	for lo := 0; lo < n; lo += foldBlock {
		hi := min(lo+foldBlock, n)
		acc, tmp := accArr[:hi-lo], tmpArr[:hi-lo]
		widen(acc, srcs[0][lo:hi])
		for _, s := range srcs[1:] {
			widen(tmp, s[lo:hi])
			combine(acc, tmp, op)
		}
		if op == Avg {
			d := float32(len(srcs))
			for i := range acc {
				acc[i] /= d
			}
		}
		d := dst[lo:hi]
		for i, v := range acc {
			d[i] = Float32ToBF16(v)
		}
	}
}

func widen(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i, h := range src {
		dst[i] = BF16ToFloat32(h)
	}
}

// combine sets acc[i] = acc[i] ⊕ s[i].
func combine[T number](acc, s []T, op ReduceOp) {
	s = s[:len(acc)]
	switch op {
	case Sum, Avg:
		for i := range acc {
			acc[i] += s[i]
		}
	case Prod:
		for i := range acc {
			acc[i] *= s[i]
		}
	case Max:
		for i := range acc {
			acc[i] = max(acc[i], s[i])
		}
	case Min:
		for i := range acc {
			acc[i] = min(acc[i], s[i])
		}
	}
}
