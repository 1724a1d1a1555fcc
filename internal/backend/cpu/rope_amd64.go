//go:build amd64

package cpu

import "golang.org/x/sys/cpu"

// AVX-512 kernels (rope_amd64.s) for RoPE's rotations, eight pairs of a
// head at a time.

// useRoPEAVX512 selects the vector kernels. Tests and benchmarks clear it
// to run the scalar code, which gives the same bits.
var useRoPEAVX512 = cpu.X86.HasAVX512F

// ropeFwdAVX512 rotates one row of nh heads of 2*half elements each,
// x[h*2*half+2i], x[h*2*half+2i+1] by cos[i], sin[i], for i < half:
// with cc = (c0,c0,c1,c1,..), ss = (-s0,s0,-s1,s1,..) and
// sw(x) = (x1,x0,x3,x2,..) it computes out = x*cc + sw(x)*ss, that is
//
//	out[2i]   = x0*c + x1*(-s)   (== x0*c - x1*s)
//	out[2i+1] = x1*c + x0*s      (== x0*s + x1*c)
//
// the bits of ropeFwdGo. nh and half are positive; out may alias x.
//
//go:noescape
func ropeFwdAVX512(out, x, cos, sin *float32, nh, half int)

// ropeBwdAVX512 accumulates the inverse rotation of one row of nh heads
// of dout into dinp as ropeFwdAVX512 does with ss = (s0,-s0,s1,-s1,..):
// dinp += (d*cc + sw(d)*ss), that is
//
//	dinp[2i]   += d0*c + d1*s
//	dinp[2i+1] += d1*c + d0*(-s)   (== d1*c - d0*s)
//
// the bits of ropeBwdGo. nh and half are positive.
//
//go:noescape
func ropeBwdAVX512(dinp, dout, cos, sin *float32, nh, half int)

// ropeFwdVec rotates one row with ropeFwdAVX512 and reports whether it
// did.
func ropeFwdVec(o, x, c, s []float32, nh int) bool {
	n := nh * 2 * len(c)
	if !useRoPEAVX512 || n == 0 {
		return false
	}
	_, _, _ = o[n-1], x[n-1], s[len(c)-1]
	ropeFwdAVX512(&o[0], &x[0], &c[0], &s[0], nh, len(c))
	return true
}

// ropeBwdVec accumulates one row with ropeBwdAVX512 and reports whether
// it did.
func ropeBwdVec(dx, d, c, s []float32, nh int) bool {
	n := nh * 2 * len(c)
	if !useRoPEAVX512 || n == 0 {
		return false
	}
	_, _, _ = dx[n-1], d[n-1], s[len(c)-1]
	ropeBwdAVX512(&dx[0], &d[0], &c[0], &s[0], nh, len(c))
	return true
}
