// fp8.cu: conversions between float32 and the OCP 8-bit formats e4m3fn
// and e5m2 (round to nearest even, bit-exact with internal/numeric), with
// a per-tensor scale applied first (out = fp8(x * scale); back:
// x = float(fp8) * scale), the scaling of fp8 matrix products.
#include "common.cuh"

// f32_to_fp8_bits rounds x to the format with mbits mantissa bits and
// exponent bias; maxCode is the largest finite pattern, over the pattern
// of an overflow without saturation (NaN for e4m3fn, Inf for e5m2).
__device__ __forceinline__ unsigned char f32_to_fp8_bits(float x, unsigned mbits, int bias, unsigned maxCode, unsigned over, int sat) {
	unsigned u = __float_as_uint(x);
	unsigned char sign = (unsigned char)((u >> 24) & 0x80u);
	unsigned a = u & 0x7fffffffu;
	if (a > 0x7f800000u) {
		return sign | 0x7f;
	}
	if (a == 0x7f800000u) {
		return sign | (unsigned char)(sat ? maxCode : over);
	}
	unsigned minNormal = (unsigned)(127 - bias + 1) << 23;
	unsigned code;
	if (a < minNormal) {
		// Adding 2^k aligns the subnormal grid with float32's last place:
		// the hardware addition rounds to nearest even.
		float magic = __uint_as_float((unsigned)(127 + 23 - (bias - 1 + (int)mbits)) << 23);
		code = __float_as_uint(__fadd_rn(__uint_as_float(a), magic)) - __float_as_uint(magic);
	} else {
		unsigned shift = 23 - mbits;
		unsigned r = a - ((unsigned)(127 - bias) << 23);
		r += (1u << (shift - 1)) - 1 + ((r >> shift) & 1u);
		code = r >> shift;
	}
	if (code > maxCode) {
		code = sat ? maxCode : over;
	}
	return sign | (unsigned char)code;
}

__device__ __forceinline__ float fp8_bits_to_f32(unsigned char b, unsigned mbits, int bias, int hasInf) {
	unsigned sign = (unsigned)(b & 0x80) << 24;
	int exp = (int)(b >> mbits) & ((1 << (7 - mbits)) - 1);
	unsigned mant = (unsigned)b & ((1u << mbits) - 1);
	int maxExp = (1 << (7 - mbits)) - 1;
	if (hasInf && exp == maxExp) {
		return __uint_as_float(mant == 0 ? (sign | 0x7f800000u) : (sign | 0x7fc00000u | (mant << (23 - mbits))));
	}
	if (!hasInf && (b & 0x7f) == 0x7f) {
		return __uint_as_float(sign | 0x7fc00000u | (mant << (23 - mbits)));
	}
	if (exp == 0) {
		float v = (float)mant * __uint_as_float((unsigned)(127 + 1 - bias - (int)mbits) << 23);
		return __uint_as_float(sign | __float_as_uint(v));
	}
	return __uint_as_float(sign | ((unsigned)(exp - bias + 127) << 23) | (mant << (23 - mbits)));
}

// f32_to_fp8: format 0 is e4m3fn, 1 is e5m2; sat clamps overflows to the
// largest finite value.
extern "C" __global__ void f32_to_fp8(unsigned char *out, const float *in, long long n, int format, int sat, float scale) {
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		float x = scale == 1.0f ? in[i] : in[i] * scale;
		out[i] = format == 0 ? f32_to_fp8_bits(x, 3, 7, 0x7e, 0x7f, sat) : f32_to_fp8_bits(x, 2, 15, 0x7b, 0x7c, sat);
	}
}

// fp8_to_f32 widens exactly and multiplies by scale.
extern "C" __global__ void fp8_to_f32(float *out, const unsigned char *in, long long n, int format, float scale) {
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		float x = format == 0 ? fp8_bits_to_f32(in[i], 3, 7, 0) : fp8_bits_to_f32(in[i], 2, 15, 1);
		out[i] = scale == 1.0f ? x : x * scale;
	}
}
