// crossentropy.cu: the fused, vocabulary-chunked cross-entropy of
// backend.Backend: running per-row statistics stats[N, 3] = (max, sum of
// exp(x - max), target logit) folded chunk by chunk, the loss, and the
// gradient written over the chunk's logits. One block per row for the
// chunk kernels (block a multiple of 32); targets < 0 are ignored rows.
#include "common.cuh"

// ce_reset sets every row to (-Inf, 0, NaN): a target no chunk covers
// yields a NaN loss.
extern "C" __global__ void ce_reset(float *stats, int N) {
	for (long long i = grid_stride_start(); i < N; i += grid_stride_step()) {
		stats[3 * i] = TITAN_NEG_INF;
		stats[3 * i + 1] = 0;
		stats[3 * i + 2] = TITAN_NAN;
	}
}

extern "C" __global__ void ce_chunk(float *stats, const float *logits, const int *targets, int N, int V, int vOff) {
	__shared__ float scratch[32];
	int i = blockIdx.x;
	if (i >= N) {
		return;
	}
	int t = targets[i];
	if (t < 0) {
		return;
	}
	const float *row = logits + (long long)i * V;
	float m = TITAN_NEG_INF;
	for (int j = threadIdx.x; j < V; j += blockDim.x) {
		m = fmaxf(m, row[j]);
	}
	m = block_max(m, scratch);
	float *s = stats + 3 * (long long)i;
	float mOld = s[0];
	m = fmaxf(m, mOld);
	float sum = 0;
	if (m > TITAN_NEG_INF) {
		for (int j = threadIdx.x; j < V; j += blockDim.x) {
			sum += expf(row[j] - m);
		}
	}
	sum = block_sum(sum, scratch);
	if (threadIdx.x == 0) {
		if (m > TITAN_NEG_INF) {
			s[1] = s[1] * expf(mOld - m) + sum;
			s[0] = m;
		}
		if (t >= vOff && t < vOff + V) {
			s[2] = row[t - vOff];
		}
	}
}

// ce_loss writes losses[i] = max + log(sum) - target logit (0 for ignored
// rows), in float64 before the final rounding.
extern "C" __global__ void ce_loss(float *losses, const float *stats, const int *targets, int N) {
	for (long long i = grid_stride_start(); i < N; i += grid_stride_step()) {
		if (targets[i] < 0) {
			losses[i] = 0;
			continue;
		}
		const float *s = stats + 3 * i;
		losses[i] = (float)((double)s[0] + log((double)s[1]) - (double)s[2]);
	}
}

// ce_chunk_bwd overwrites the chunk with scale*(softmax - onehot(target)).
extern "C" __global__ void ce_chunk_bwd(float *logits, const float *stats, const int *targets, int N, int V, int vOff, float scale) {
	int i = blockIdx.x;
	if (i >= N) {
		return;
	}
	float *row = logits + (long long)i * V;
	int t = targets[i];
	if (t < 0) {
		for (int j = threadIdx.x; j < V; j += blockDim.x) {
			row[j] = 0;
		}
		return;
	}
	const float *s = stats + 3 * (long long)i;
	float m = s[0], mul = scale / s[1];
	for (int j = threadIdx.x; j < V; j += blockDim.x) {
		float g = expf(row[j] - m) * mul;
		if (j + vOff == t) {
			g -= scale;
		}
		row[j] = g;
	}
}
