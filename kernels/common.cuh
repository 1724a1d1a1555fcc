// common.cuh: helpers shared by the kernels of titan's CUDA backend. It
// includes nothing, so that NVRTC compiles it without the CUDA headers.
//
// Conventions (see internal/backend/backend.go): matrices are row-major,
// forward kernels overwrite their outputs and backward kernels accumulate
// (+=) into every gradient. Every kernel is extern "C" so that the backend
// finds it by name (cuModuleGetFunction), and every kernel that needs a
// block size assumes the one its launch in internal/backend/cuda uses.
#ifndef TITAN_KERNELS_COMMON_CUH
#define TITAN_KERNELS_COMMON_CUH

#define TITAN_INF __uint_as_float(0x7f800000u)
#define TITAN_NEG_INF __uint_as_float(0xff800000u)
#define TITAN_NAN __uint_as_float(0x7fc00000u)

typedef unsigned short bf16_t; // a bfloat16 bit pattern

// warp_sum returns the sum of v over the 32 lanes of the warp (every lane
// gets the result). The butterfly adds in the same order on every lane.
__device__ __forceinline__ float warp_sum(float v) {
	for (int o = 16; o > 0; o >>= 1) {
		v += __shfl_xor_sync(0xffffffffu, v, o);
	}
	return v;
}

__device__ __forceinline__ double warp_sum_f64(double v) {
	for (int o = 16; o > 0; o >>= 1) {
		v += __shfl_xor_sync(0xffffffffu, v, o);
	}
	return v;
}

// warp_max returns the maximum of v over the warp.
__device__ __forceinline__ float warp_max(float v) {
	for (int o = 16; o > 0; o >>= 1) {
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	}
	return v;
}

// block_sum returns the sum of v over the block (blockDim.x a multiple of
// 32, at most 1024) to every thread. scratch holds 32 floats of shared
// memory; the call synchronises the block.
__device__ __forceinline__ float block_sum(float v, float *scratch) {
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	v = warp_sum(v);
	__syncthreads(); // scratch may still be read by a previous call
	if (lane == 0) {
		scratch[warp] = v;
	}
	__syncthreads();
	v = lane < nw ? scratch[lane] : 0.0f;
	return warp_sum(v);
}

__device__ __forceinline__ double block_sum_f64(double v, double *scratch) {
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	v = warp_sum_f64(v);
	__syncthreads();
	if (lane == 0) {
		scratch[warp] = v;
	}
	__syncthreads();
	v = lane < nw ? scratch[lane] : 0.0;
	return warp_sum_f64(v);
}

__device__ __forceinline__ float block_max(float v, float *scratch) {
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	v = warp_max(v);
	__syncthreads();
	if (lane == 0) {
		scratch[warp] = v;
	}
	__syncthreads();
	v = lane < nw ? scratch[lane] : TITAN_NEG_INF;
	return warp_max(v);
}

// bf16_to_f32 widens a bfloat16 exactly.
__device__ __forceinline__ float bf16_to_f32(bf16_t h) { return __uint_as_float(((unsigned)h) << 16); }

// f32_to_bf16 rounds to the nearest bfloat16, ties to even; a NaN stays a
// quiet NaN of the same sign with the leading payload bits, exactly as
// internal/numeric.Float32ToBF16.
__device__ __forceinline__ bf16_t f32_to_bf16(float x) {
	unsigned u = __float_as_uint(x);
	if ((u & 0x7fffffffu) > 0x7f800000u) {
		return (bf16_t)((u >> 16) | 0x0040u);
	}
	u += 0x7fffu + ((u >> 16) & 1u);
	return (bf16_t)(u >> 16);
}

// grid_stride_start and grid_stride_step walk n elements over a 1-D grid.
__device__ __forceinline__ long long grid_stride_start() { return (long long)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ long long grid_stride_step() { return (long long)gridDim.x * blockDim.x; }

#endif
