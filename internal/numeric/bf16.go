// Package numeric holds titan's low-precision floating-point formats:
// bfloat16 and the two OCP 8-bit formats float8 e4m3fn and e5m2, with
// bit-exact conversions from and to float32.
//
// Every conversion from float32 rounds to nearest, ties to even (RNE), as
// IEEE 754 and PyTorch do. The values are carried as their bit patterns
// (uint16, uint8), the way backend memory and checkpoints hold them.
//
// # bfloat16 and the x86 instructions
//
// Float32ToBF16 is IEEE RNE: it keeps float32 subnormals as bfloat16
// subnormals, exactly as PyTorch's float32 → bfloat16 cast does. The
// AVX512_BF16 instructions differ in one place: VCVTNEPS2BF16 and
// VCVTNE2PS2BF16 treat a subnormal input as a zero of its sign (DAZ), and
// VDPBF16PS treats subnormal bfloat16 operands as zero and flushes
// subnormal results. Float32ToBF16DAZ is that hardware conversion; the
// CPU bf16 GEMM (package gemm) uses it on every kernel, with or without
// the instructions, so that its results do not depend on the CPU. All
// other conversions in titan (parameter casts, checkpoints, exports,
// communication) use Float32ToBF16. On NaN both keep the sign and the
// leading payload bits and set the quiet bit.
package numeric

import "math"

// BF16ToFloat32 widens a bfloat16 bit pattern to float32, exactly.
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToBF16 rounds x to the nearest bfloat16, ties to even. Values of
// at least the largest bfloat16 plus half its spacing round to infinity,
// subnormals round like any other value, and a NaN stays a NaN of the
// same sign (quiet, with the leading 6 bits of its payload).
func Float32ToBF16(x float32) uint16 {
	u := math.Float32bits(x)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x0040
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// Float32ToBF16DAZ is Float32ToBF16 with a subnormal x read as a zero of
// its sign, as the x86 VCVTNEPS2BF16 instruction does.
func Float32ToBF16DAZ(x float32) uint16 {
	u := math.Float32bits(x)
	if u&0x7f800000 == 0 {
		return uint16(u>>16) & 0x8000
	}
	return Float32ToBF16(x)
}

// BF16DAZ returns h, or a zero of its sign when h is subnormal: the value
// VDPBF16PS multiplies with.
func BF16DAZ(h uint16) uint16 {
	if h&0x7f80 == 0 {
		return h & 0x8000
	}
	return h
}

// Float32sToBF16 stores Float32ToBF16(src[i]) in dst[i] for every i,
// 16 at a time with AVX-512 where the CPU has it (bit for bit the same);
// dst must be at least as long as src.
func Float32sToBF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	done := float32sToBF16Vec(dst, src)
	for i, x := range src[done:] {
		dst[done+i] = Float32ToBF16(x)
	}
}

// BF16sToFloat32 stores BF16ToFloat32(src[i]) in dst[i] for every i,
// with AVX-512 where the CPU has it; dst must be at least as long as src.
func BF16sToFloat32(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	done := bf16sToFloat32Vec(dst, src)
	for i, h := range src[done:] {
		dst[done+i] = BF16ToFloat32(h)
	}
}

// RoundBF16 returns x rounded to the nearest bfloat16 (Float32ToBF16),
// as a float32.
func RoundBF16(x float32) float32 { return BF16ToFloat32(Float32ToBF16(x)) }
