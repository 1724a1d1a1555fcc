// layout.cu: data movement kernels: embedding gather/scatter, row
// broadcast, batched transpose.
#include "common.cuh"

// embedding_fwd gathers out[i, :] = table[tokens[i], :] (one thread per
// element). Tokens are checked on the host before the launch.
extern "C" __global__ void embedding_fwd(float *out, const float *table, const int *tokens, int N, int C) {
	long long n = (long long)N * C;
	for (long long e = grid_stride_start(); e < n; e += grid_stride_step()) {
		long long i = e / C;
		int c = (int)(e % C);
		out[e] = table[(long long)tokens[i] * C + c];
	}
}

// embedding_bwd accumulates dtable[tokens[i], :] += dout[i, :]. One
// thread per column walks the tokens in order, so repeated tokens never
// race and every element sums its contributions in token order, as the
// CPU backend does (bitwise equal results).
extern "C" __global__ void embedding_bwd(float *dtable, const float *dout, const int *tokens, int N, int C) {
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	if (c >= C) {
		return;
	}
	for (int i = 0; i < N; i++) {
		dtable[(long long)tokens[i] * C + c] += dout[(long long)i * C + c];
	}
}

// broadcast_rows sets every row of out [N, C] to row.
extern "C" __global__ void broadcast_rows(float *out, const float *row, int N, int C) {
	long long n = (long long)N * C;
	for (long long e = grid_stride_start(); e < n; e += grid_stride_step()) {
		out[e] = row[e % C];
	}
}

// transpose writes out[b, c, r] = inp[b, r, c] for B matrices R × C,
// through a 32 × 33 shared tile (block 32 × 8, grid (ceil(C/32),
// ceil(R/32), B)).
extern "C" __global__ void transpose_f32(float *out, const float *inp, int B, int R, int C) {
	__shared__ float tile[32][33];
	int b = blockIdx.z;
	int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
	const float *src = inp + (long long)b * R * C;
	float *dst = out + (long long)b * R * C;
	for (int y = threadIdx.y; y < 32; y += blockDim.y) {
		int r = r0 + y, c = c0 + threadIdx.x;
		if (r < R && c < C) {
			tile[y][threadIdx.x] = src[(long long)r * C + c];
		}
	}
	__syncthreads();
	for (int y = threadIdx.y; y < 32; y += blockDim.y) {
		int c = c0 + y, r = r0 + threadIdx.x;
		if (r < R && c < C) {
			dst[(long long)c * R + r] = tile[threadIdx.x][y];
		}
	}
}
