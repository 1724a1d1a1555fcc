// rmsnorm.cu: RMSNorm forward and backward, and the column reductions of
// the weight gradients.
//
// rmsnorm_fwd and rmsnorm_bwd_dx take one block per row (grid N, block a
// multiple of 32). Column sums (dweight) run in two deterministic stages:
// *_partial writes float64 sums over row ranges, col_reduce_f64 adds them
// in order.
#include "common.cuh"

// rmsnorm_fwd computes out = inp * rstd * weight with
// rstd = 1/sqrt(mean(inp^2) + eps) per row, saving rstd.
extern "C" __global__ void rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps) {
	__shared__ float scratch[32];
	int i = blockIdx.x;
	if (i >= N) {
		return;
	}
	const float *x = inp + (long long)i * C;
	float s = 0;
	for (int j = threadIdx.x; j < C; j += blockDim.x) {
		s += x[j] * x[j];
	}
	s = block_sum(s, scratch);
	float r = (float)(1.0 / sqrt((double)(s / (float)C + eps)));
	if (threadIdx.x == 0) {
		rstd[i] = r;
	}
	float *o = out + (long long)i * C;
	for (int j = threadIdx.x; j < C; j += blockDim.x) {
		o[j] = x[j] * r * weight[j];
	}
}

// rmsnorm_bwd_dx accumulates
// dinp += rstd*w*dout - inp*rstd^3/C * sum_k(dout*w*inp).
extern "C" __global__ void rmsnorm_bwd_dx(float *dinp, const float *dout, const float *inp, const float *weight, const float *rstd, int N, int C) {
	__shared__ float scratch[32];
	int i = blockIdx.x;
	if (i >= N) {
		return;
	}
	long long row = (long long)i * C;
	float s = 0;
	for (int j = threadIdx.x; j < C; j += blockDim.x) {
		s += dout[row + j] * weight[j] * inp[row + j];
	}
	s = block_sum(s, scratch);
	float r = rstd[i];
	float k = r * r * r * s / (float)C;
	for (int j = threadIdx.x; j < C; j += blockDim.x) {
		dinp[row + j] += r * weight[j] * dout[row + j] - k * inp[row + j];
	}
}

// rmsnorm_dw_partial writes part[p, j] = sum over rows [p*rows, (p+1)*rows)
// of dout*inp*rstd, in float64 (grid: (ceil(C/blockDim), P)).
extern "C" __global__ void rmsnorm_dw_partial(double *part, const float *dout, const float *inp, const float *rstd, int N, int C, int rows) {
	int j = blockIdx.x * blockDim.x + threadIdx.x;
	int p = blockIdx.y;
	if (j >= C) {
		return;
	}
	double a = 0;
	int end = min(N, (p + 1) * rows);
	for (int i = p * rows; i < end; i++) {
		long long o = (long long)i * C + j;
		a += (double)dout[o] * (double)inp[o] * (double)rstd[i];
	}
	part[(long long)p * C + j] = a;
}

// sum_rows_partial writes part[p, j] = sum over its rows of src[i, j] (a
// bias gradient), in float64.
extern "C" __global__ void sum_rows_partial(double *part, const float *src, int N, int C, int rows) {
	int j = blockIdx.x * blockDim.x + threadIdx.x;
	int p = blockIdx.y;
	if (j >= C) {
		return;
	}
	double a = 0;
	int end = min(N, (p + 1) * rows);
	for (int i = p * rows; i < end; i++) {
		a += (double)src[(long long)i * C + j];
	}
	part[(long long)p * C + j] = a;
}

// col_reduce_f64 accumulates dst[j] += sum_p part[p, j], p in order.
extern "C" __global__ void col_reduce_f64(float *dst, const double *part, int P, int C) {
	int j = blockIdx.x * blockDim.x + threadIdx.x;
	if (j >= C) {
		return;
	}
	double a = 0;
	for (int p = 0; p < P; p++) {
		a += part[(long long)p * C + j];
	}
	dst[j] += (float)a;
}

// layernorm_fwd computes out = (inp - mean) * rstd * weight + bias per
// row (biased variance), saving mean and rstd. One block per row.
extern "C" __global__ void layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *weight, const float *bias, int N, int C, float eps) {
	__shared__ float scratch[32];
	int i = blockIdx.x;
	if (i >= N) {
		return;
	}
	const float *x = inp + (long long)i * C;
	float s = 0;
	for (int j = threadIdx.x; j < C; j += blockDim.x) {
		s += x[j];
	}
	float mu = block_sum(s, scratch) / (float)C;
	float v = 0;
	for (int j = threadIdx.x; j < C; j += blockDim.x) {
		float d = x[j] - mu;
		v += d * d;
	}
	v = block_sum(v, scratch) / (float)C;
	float r = (float)(1.0 / sqrt((double)(v + eps)));
	if (threadIdx.x == 0) {
		mean[i] = mu;
		rstd[i] = r;
	}
	float *o = out + (long long)i * C;
	for (int j = threadIdx.x; j < C; j += blockDim.x) {
		o[j] = (x[j] - mu) * r * weight[j] + bias[j];
	}
}

// layernorm_bwd_dx accumulates dinp += rstd*(g - mean(g) - xhat*mean(g*xhat))
// with g = dout*weight and xhat = (inp-mean)*rstd.
extern "C" __global__ void layernorm_bwd_dx(float *dinp, const float *dout, const float *inp, const float *weight, const float *mean, const float *rstd, int N, int C) {
	__shared__ float scratch[32];
	int i = blockIdx.x;
	if (i >= N) {
		return;
	}
	long long row = (long long)i * C;
	float mu = mean[i], r = rstd[i];
	float s1 = 0, s2 = 0;
	for (int j = threadIdx.x; j < C; j += blockDim.x) {
		float g = dout[row + j] * weight[j];
		s1 += g;
		s2 += g * (inp[row + j] - mu) * r;
	}
	s1 = block_sum(s1, scratch) / (float)C;
	s2 = block_sum(s2, scratch) / (float)C;
	for (int j = threadIdx.x; j < C; j += blockDim.x) {
		float g = dout[row + j] * weight[j];
		float xh = (inp[row + j] - mu) * r;
		dinp[row + j] += r * (g - s1 - xh * s2);
	}
}

// layernorm_dw_partial writes the float64 partial sums of
// dweight = sum dout*xhat (into partW) and dbias = sum dout (into partB).
extern "C" __global__ void layernorm_dw_partial(double *partW, double *partB, const float *dout, const float *inp, const float *mean, const float *rstd, int N, int C, int rows) {
	int j = blockIdx.x * blockDim.x + threadIdx.x;
	int p = blockIdx.y;
	if (j >= C) {
		return;
	}
	double aw = 0, ab = 0;
	int end = min(N, (p + 1) * rows);
	for (int i = p * rows; i < end; i++) {
		long long o = (long long)i * C + j;
		double d = dout[o];
		aw += d * ((double)inp[o] - (double)mean[i]) * (double)rstd[i];
		ab += d;
	}
	partW[(long long)p * C + j] = aw;
	partB[(long long)p * C + j] = ab;
}
