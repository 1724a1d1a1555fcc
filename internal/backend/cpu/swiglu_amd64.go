//go:build amd64

package cpu

import "golang.org/x/sys/cpu"

// Fused AVX-512 kernels (swiglu_amd64.s) for SwiGLU: the sigmoid of
// sigmoidAVX2 and the products of the scalar loops in registers, 16 lanes
// at a time.

// useSwiGLUAVX512 selects the fused kernels. Tests and benchmarks clear it
// to run the scalar code, which gives the same bits.
var useSwiGLUAVX512 = cpu.X86.HasAVX512F

// swigluLanes is the kernels' block: they stop before a block of this
// many elements that holds a gate they cannot take.
const swigluLanes = 16

// swigluFwdAVX512 sets out[i] = (x*s)*up[i] with x = gate[i] and
// s = 1/(1 + exp(-x)) computed with the operations of sigmoidAVX2, for
// i < n, in blocks of 16 (the last one masked). It stops before the
// first block holding a gate below -expFast or NaN and returns the number
// of elements done.
//
//go:noescape
func swigluFwdAVX512(out, gate, up *float32, n int) int

// swigluBwdAVX512 accumulates, for i < n with x = gate[i], d = dout[i]
// and s the sigmoid of swigluFwdAVX512,
//
//	dgate[i] += ((d*up[i])*s) * (1 + x*(1-s))
//	dup[i]   += (d*x)*s
//
// in blocks of 16 (the last one masked), with the same early stop as
// swigluFwdAVX512; it returns the number of elements done.
//
//go:noescape
func swigluBwdAVX512(dgate, dup, dout, gate, up *float32, n int) int

// swigluFwdBlocks runs the leading elements of SwiGLUForward's chunk
// through swigluFwdAVX512 and returns how many it did.
func swigluFwdBlocks(o, g, u []float32) int {
	if !useSwiGLUAVX512 || len(g) == 0 {
		return 0
	}
	o, u = o[:len(g)], u[:len(g)]
	return swigluFwdAVX512(&o[0], &g[0], &u[0], len(g))
}

// swigluBwdBlocks runs the leading elements of SwiGLUBackward's chunk
// through swigluBwdAVX512 and returns how many it did.
func swigluBwdBlocks(dg, du, d, g, u []float32) int {
	if !useSwiGLUAVX512 || len(g) == 0 {
		return 0
	}
	dg, du, d, u = dg[:len(g)], du[:len(g)], d[:len(g)], u[:len(g)]
	return swigluBwdAVX512(&dg[0], &du[0], &d[0], &g[0], &u[0], len(g))
}
