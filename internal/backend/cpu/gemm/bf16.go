package gemm

import (
	"sync/atomic"

	"github.com/titan-go/titan/internal/backend/cpu/workpool"
	"github.com/titan-go/titan/internal/numeric"
)

// An Operand is one matrix of GemmBF16: float32 elements (an input
// rounded to bfloat16 while it is packed) or bfloat16 bit patterns (the
// []uint16 of bfloat16 backend memory).
type Operand struct {
	f32  []float32
	bf16 []uint16
}

// F32 is the Operand of float32 elements x.
func F32(x []float32) Operand { return Operand{f32: x} }

// BF16 is the Operand of bfloat16 elements x.
func BF16(x []uint16) Operand { return Operand{bf16: x} }

func (o Operand) len() int { return len(o.f32) + len(o.bf16) }

// GemmBF16 computes C = alpha*op(A)*op(B) + beta*C like Sgemm, with the
// products of bfloat16 operands and float32 accumulation: each element of
// A and B is first rounded to bfloat16 (numeric.Float32ToBF16DAZ for a
// float32 operand), and a subnormal bfloat16 operand counts as zero, as
// the VDPBF16PS instruction has it. alpha and beta are float32.
//
// C is float32, or bfloat16: then every K step accumulates in a float32
// tile of the work item (holding C widened first when beta != 0), which
// is rounded into C to nearest even (numeric.Float32ToBF16) once, after
// the last step, so that C is exactly the bfloat16 rounding of the
// float32 C's result, whatever the threads.
//
// The kernel is chosen like Sgemm's (see BF16Kernels): on CPUs with
// AVX512_BF16 the VDPBF16PS micro-kernel, which multiplies twice as many
// elements per instruction as the float32 one; elsewhere one of the
// float32 kernels on the rounded operands. Both accumulate the same
// exact products in float32, only in different orders, so they differ
// by float32 rounding alone. Blocking, threading and the rules on p, the
// transposes and the arguments are Sgemm's.
func GemmBF16(p *workpool.Pool, transA, transB bool, m, n, k int, alpha float32, a Operand, lda int, b Operand, ldb int, beta float32, c Operand, ldc int) {
	checkArgs(transA, transB, m, n, k, a.len(), lda, 0, b.len(), ldb, 0, c.len(), ldc, 0, 1)
	threads := 1
	if p != nil {
		threads = p.Size()
	}
	gemm(p, threads, activeBF16.Load(), transA, transB, m, n, k, alpha, a.f32, a.bf16, lda, b.f32, b.bf16, ldb, beta, c.f32, c.bf16, ldc)
}

// bf16Kernels lists the kernels of GemmBF16 this machine supports,
// fastest first: the AVX512_BF16 kernel where the CPU has it, then every
// float32 kernel on operands rounded to bfloat16, under its own name.
var bf16Kernels = append(archBF16Kernels(), roundingKernels()...)

// activeBF16 is the GemmBF16 kernel in use.
var activeBF16 atomic.Pointer[kernel]

func init() { activeBF16.Store(bf16Kernels[0]) }

// BF16Kernels returns the names of the GemmBF16 kernels this machine
// supports, fastest first: "avx512bf16" (VDPBF16PS) where the CPU has
// AVX512_BF16, then the float32 kernels of Kernels, which run on the
// operands rounded to bfloat16.
func BF16Kernels() []string { return kernelNames(bf16Kernels) }

// BF16Kernel returns the name of the GemmBF16 kernel in use.
func BF16Kernel() string { return activeBF16.Load().name }

// BF16PeakRatio is the peak of the GemmBF16 kernel in use over the
// float32 GEMM's: 2 for the AVX512_BF16 kernel (each VDPBF16PS lane
// multiplies and adds a pair of bfloat16 values where VFMADD231PS does
// one float32), 1 for a fallback, which multiplies in float32. MFU of a
// bfloat16 run is against the float32 peak times it.
func BF16PeakRatio() float64 { return float64(max(1, activeBF16.Load().kpack)) }

// SetBF16Kernel selects the GemmBF16 kernel by name (see BF16Kernels),
// for tests and benchmarks.
func SetBF16Kernel(name string) error {
	return selectKernel("bf16 kernel", bf16Kernels, &activeBF16, name)
}

// roundingKernels returns the float32 kernels with packing that rounds
// the operands to bfloat16: the fallback of GemmBF16.
func roundingKernels() []*kernel {
	var out []*kernel
	for _, k32 := range kernels {
		k := *k32
		transPack, copyPack := k32.transPack, k32.copyPack
		k.transPack = func(dst, src []float32, ld, rows, lanes, kc int) {
			transPack(dst, src, ld, rows, lanes, kc)
			roundBF16(dst[:kc*lanes])
		}
		k.copyPack = func(dst, src []float32, ld, lanes, kc, cols int) {
			copyPack(dst, src, ld, lanes, kc, cols)
			roundBF16(dst[:(cols+lanes-1)/lanes*kc*lanes])
		}
		k.transPackBF16 = transPackWiden
		k.copyPackBF16 = copyPackWiden
		out = append(out, &k)
	}
	return out
}

// roundBF16 rounds every element of x to bfloat16 as the AVX512_BF16
// kernel's packing and multiplication see it: subnormals become zeros.
func roundBF16(x []float32) {
	for i, v := range x {
		x[i] = numeric.BF16ToFloat32(numeric.BF16DAZ(numeric.Float32ToBF16DAZ(v)))
	}
}

// widen is the float32 value VDPBF16PS multiplies a bfloat16 h with.
func widen(h uint16) float32 { return numeric.BF16ToFloat32(numeric.BF16DAZ(h)) }

// transPackWiden is transPackGo from bfloat16 sources.
func transPackWiden(dst []float32, src []uint16, ld, rows, lanes, kc int) {
	dst = dst[:kc*lanes]
	for r := 0; r < rows; r++ {
		s := src[r*ld : r*ld+kc]
		for p, v := range s {
			dst[p*lanes+r] = widen(v)
		}
	}
	if rows < lanes {
		for p := 0; p < kc; p++ {
			clear(dst[p*lanes+rows : p*lanes+lanes])
		}
	}
}

// copyPackWiden is copyPackGo from bfloat16 sources.
func copyPackWiden(dst []float32, src []uint16, ld, lanes, kc, cols int) {
	panels := (cols + lanes - 1) / lanes
	dst = dst[:panels*kc*lanes]
	for p := 0; p < kc; p++ {
		s := src[p*ld : p*ld+cols]
		for q := 0; q < panels; q++ {
			d := dst[(q*kc+p)*lanes : (q*kc+p+1)*lanes]
			n := min(lanes, cols-q*lanes)
			for r, v := range s[q*lanes : q*lanes+n] {
				d[r] = widen(v)
			}
			clear(d[n:])
		}
	}
}
