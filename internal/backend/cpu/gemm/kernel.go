package gemm

import (
	"fmt"
	"strings"
	"sync/atomic"
)

// A kernel is one micro-kernel together with the packing routines and
// cache blocking that suit it.
//
// Packed layouts: an A micro-panel holds kc×mr floats, the mr elements of
// column p of the tile's rows stored at [p*mr, p*mr+mr); a B micro-panel
// holds kc×nr floats, row p of the tile's columns stored at
// [p*nr, p*nr+nr). Rows or columns past the edge of the matrix are zero.
//
// The bfloat16 kernel (kpack = 2) packs the same way with pairs: each
// 32-bit element of a micro-panel holds the bfloat16 values of columns
// (A) or rows (B) 2p and 2p+1, so that a kc-deep panel has ceil(kc/2)
// rows of words; packed buffers stay []float32, as words.
type kernel struct {
	name   string
	mr, nr int
	// kc and mc are the cache blocking: a kc×nr B micro-panel stays in
	// L1 while the micro-kernel sweeps it with the mr-row micro-panels of
	// an at most mc×kc packed A block held in L2. kc counts elements of
	// K, a multiple of kpack.
	kc, mc int
	// kpack is how many consecutive elements of K one packed 32-bit word
	// holds: 1 (float32) or 2 (a bfloat16 pair).
	kpack int

	// micro computes C[0:rows, 0:cols] = alpha*A·B + beta*C from the packed
	// micro-panels a (kw×mr words) and b (kw×nr); c starts at the tile's
	// first element and has row stride ldc. beta == 0 ignores the old C.
	micro func(kw int, a, b, c []float32, ldc int, alpha, beta float32, rows, cols int)

	// transPack stores dst[p*lanes+r] = src[r*ld+p] for p < kc, r < rows,
	// and zero for rows <= r < lanes.
	transPack func(dst, src []float32, ld, rows, lanes, kc int)
	// copyPack packs the cols leading columns of kc rows of src (row
	// stride ld) into ceil(cols/lanes) consecutive kc×lanes panels: for
	// panel q, dst[(q*kc+p)*lanes+r] = src[p*ld+q*lanes+r] when
	// q*lanes+r < cols, else 0.
	copyPack func(dst, src []float32, ld, lanes, kc, cols int)

	// transPackBF16 and copyPackBF16 are transPack and copyPack from
	// bfloat16 sources; only the kernels of GemmBF16 have them.
	transPackBF16 func(dst []float32, src []uint16, ld, rows, lanes, kc int)
	copyPackBF16  func(dst []float32, src []uint16, ld, lanes, kc, cols int)
}

// words is the number of packed rows of words a depth of kc elements of
// K occupies.
func (k *kernel) words(kc int) int { return (kc + k.kpack - 1) / k.kpack }

// kernels lists the kernels this machine supports, fastest first.
var kernels = append(archKernels(), &kernel{
	name: "generic", mr: 4, nr: 4, kc: 256, mc: 128, kpack: 1,
	micro: microGeneric, transPack: transPackGo, copyPack: copyPackGo,
})

// active is the kernel in use.
var active atomic.Pointer[kernel]

func init() { active.Store(kernels[0]) }

// Kernels returns the names of the micro-kernels this machine supports,
// fastest first: a subset of "avx512", "avx2" and "generic".
func Kernels() []string { return kernelNames(kernels) }

// kernelNames returns the names of ks.
func kernelNames(ks []*kernel) []string {
	names := make([]string, len(ks))
	for i, k := range ks {
		names[i] = k.name
	}
	return names
}

// selectKernel stores in active the kernel of ks named name; what names
// the list in the error.
func selectKernel(what string, ks []*kernel, active *atomic.Pointer[kernel], name string) error {
	for _, k := range ks {
		if k.name == name {
			active.Store(k)
			return nil
		}
	}
	return fmt.Errorf("gemm: %s %q not supported on this machine (have %s)", what, name, strings.Join(kernelNames(ks), ", "))
}

// Kernel returns the name of the micro-kernel in use.
func Kernel() string { return active.Load().name }

// SetKernel selects the micro-kernel by name (see Kernels) for the
// multiplications that start after it returns. It is meant for tests and
// benchmarks; by default the fastest supported kernel runs.
func SetKernel(name string) error { return selectKernel("kernel", kernels, &active, name) }

// microGeneric is the portable 4×4 micro-kernel.
func microGeneric(kc int, a, b, c []float32, ldc int, alpha, beta float32, rows, cols int) {
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	var c20, c21, c22, c23, c30, c31, c32, c33 float32
	a = a[:4*kc]
	b = b[:4*kc]
	for len(a) >= 4 && len(b) >= 4 {
		a0, a1, a2, a3 := a[0], a[1], a[2], a[3]
		b0, b1, b2, b3 := b[0], b[1], b[2], b[3]
		a, b = a[4:], b[4:]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		c20 += a2 * b0
		c21 += a2 * b1
		c22 += a2 * b2
		c23 += a2 * b3
		c30 += a3 * b0
		c31 += a3 * b1
		c32 += a3 * b2
		c33 += a3 * b3
	}
	acc := [16]float32{
		c00, c01, c02, c03,
		c10, c11, c12, c13,
		c20, c21, c22, c23,
		c30, c31, c32, c33,
	}
	storeTile(acc[:], 4, rows, cols, c, ldc, alpha, beta)
}

// storeTile writes C[0:rows, 0:cols] = alpha*T + beta*C, where T has row
// stride ldt, ignoring the old C when beta == 0.
func storeTile(t []float32, ldt, rows, cols int, c []float32, ldc int, alpha, beta float32) {
	for i := 0; i < rows; i++ {
		row := c[i*ldc : i*ldc+cols]
		src := t[i*ldt : i*ldt+cols]
		if beta == 0 {
			for j, v := range src {
				row[j] = alpha * v
			}
		} else {
			for j, v := range src {
				row[j] = alpha*v + beta*row[j]
			}
		}
	}
}

// transPackGo is the portable transPack.
func transPackGo(dst, src []float32, ld, rows, lanes, kc int) {
	dst = dst[:kc*lanes]
	for r := 0; r < rows; r++ {
		s := src[r*ld : r*ld+kc]
		for p, v := range s {
			dst[p*lanes+r] = v
		}
	}
	if rows < lanes {
		for p := 0; p < kc; p++ {
			clear(dst[p*lanes+rows : p*lanes+lanes])
		}
	}
}

// copyPackGo is the portable copyPack.
func copyPackGo(dst, src []float32, ld, lanes, kc, cols int) {
	panels := (cols + lanes - 1) / lanes
	dst = dst[:panels*kc*lanes]
	for p := 0; p < kc; p++ {
		s := src[p*ld : p*ld+cols]
		for q := 0; q < panels; q++ {
			d := dst[(q*kc+p)*lanes : (q*kc+p+1)*lanes]
			n := copy(d, s[q*lanes:])
			clear(d[n:])
		}
	}
}
