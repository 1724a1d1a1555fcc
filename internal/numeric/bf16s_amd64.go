package numeric

import "golang.org/x/sys/cpu"

// float32sToBF16AVX512 is Float32sToBF16 on n values, n a multiple of 16.
//
//go:noescape
func float32sToBF16AVX512(dst *uint16, src *float32, n int)

// bf16sToFloat32AVX512 is BF16sToFloat32 on n values, n a multiple of 16.
//
//go:noescape
func bf16sToFloat32AVX512(dst *float32, src *uint16, n int)

var hasAVX512 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW

// float32sToBF16Vec converts the leading multiple of 16 elements of src
// into dst with AVX-512 where the CPU has it, and returns how many.
func float32sToBF16Vec(dst []uint16, src []float32) int {
	n := len(src) &^ 15
	if !hasAVX512 || n == 0 {
		return 0
	}
	_ = dst[n-1]
	float32sToBF16AVX512(&dst[0], &src[0], n)
	return n
}

// bf16sToFloat32Vec is float32sToBF16Vec for BF16sToFloat32.
func bf16sToFloat32Vec(dst []float32, src []uint16) int {
	n := len(src) &^ 15
	if !hasAVX512 || n == 0 {
		return 0
	}
	_ = dst[n-1]
	bf16sToFloat32AVX512(&dst[0], &src[0], n)
	return n
}
