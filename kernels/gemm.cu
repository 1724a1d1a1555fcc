// gemm.cu: a tiled GEMM, C = alpha op(A) op(B) + beta C (row-major), for
// devices or builds without cuBLASLt (the emulator; cuBLASLt is the fast
// path on a GPU). A and B are float32 or bfloat16 (aBF16, bBF16); when
// either is bfloat16, float32 operands are rounded to bfloat16 first, so
// the products are of bfloat16 values accumulated in float32, as
// backend.Backend.Gemm specifies. beta == 0 overwrites C (NaNs in C are
// not propagated). Strided batches: grid.z is the batch.
//
// Block 16 × 16, grid (ceil(n/16), ceil(m/16), batch); each thread owns one
// element of C and the k dimension is walked in tiles of 16 through shared
// memory.
#include "common.cuh"

#define GEMM_T 16

__device__ __forceinline__ float gemm_load(const void *p, long long idx, int isBF16, int roundBF16) {
	if (isBF16) {
		return bf16_to_f32(((const bf16_t *)p)[idx]);
	}
	float x = ((const float *)p)[idx];
	return roundBF16 ? bf16_to_f32(f32_to_bf16(x)) : x;
}

extern "C" __global__ void gemm_tiled(int transA, int transB, int m, int n, int k, float alpha,
				      const void *A, int aBF16, int lda, long long strideA,
				      const void *Bm, int bBF16, int ldb, long long strideB,
				      float beta, float *Cm, int ldc, long long strideC) {
	__shared__ float As[GEMM_T][GEMM_T + 1];
	__shared__ float Bs[GEMM_T][GEMM_T + 1];
	int round = aBF16 || bBF16;
	long long z = blockIdx.z;
	long long aBase = z * strideA, bBase = z * strideB;
	float *C = Cm + z * strideC;
	int tx = threadIdx.x, ty = threadIdx.y;
	int row = blockIdx.y * GEMM_T + ty, col = blockIdx.x * GEMM_T + tx;
	float acc = 0;
	for (int k0 = 0; k0 < k; k0 += GEMM_T) {
		// As[ty][tx] = op(A)[row, k0+tx]; Bs[ty][tx] = op(B)[k0+ty, col].
		int ka = k0 + tx, kb = k0 + ty;
		float a = 0, bv = 0;
		if (row < m && ka < k) {
			long long idx = transA ? (long long)ka * lda + row : (long long)row * lda + ka;
			a = gemm_load(A, aBase + idx, aBF16, round);
		}
		if (kb < k && col < n) {
			long long idx = transB ? (long long)col * ldb + kb : (long long)kb * ldb + col;
			bv = gemm_load(Bm, bBase + idx, bBF16, round);
		}
		As[ty][tx] = a;
		Bs[ty][tx] = bv;
		__syncthreads();
		for (int x = 0; x < GEMM_T; x++) {
			acc += As[ty][x] * Bs[x][tx];
		}
		__syncthreads();
	}
	if (row < m && col < n) {
		float *c = C + (long long)row * ldc + col;
		*c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
	}
}
