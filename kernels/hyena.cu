// hyena.cu: the per-channel operations of Hyena-style models over
// channel-major [B, C, L] buffers (skip scale, short causal depthwise
// convolution, its one-step form for generation) and the periodic
// activation sin(freq·x). Weight gradients are deterministic block or
// column reductions in float64.
#include "common.cuh"

// channel_scale_add: out[b,c,l] = a[b,c,l] + w[c] x[b,c,l]; out may alias a.
extern "C" __global__ void channel_scale_add(float *out, const float *a, const float *x, const float *w, int B, int C, int L) {
	long long n = (long long)B * C * L;
	for (long long e = grid_stride_start(); e < n; e += grid_stride_step()) {
		int c = (int)(e / L % C);
		out[e] = a[e] + w[c] * x[e];
	}
}

// channel_scale_add_bwd: one block per channel c (grid C). dx += w[c] dout
// and dw[c] += sum over (b, l) of dout x.
extern "C" __global__ void channel_scale_add_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w, int B, int C, int L) {
	__shared__ double scratch[32];
	int c = blockIdx.x;
	double acc = 0;
	for (int e = threadIdx.x; e < B * L; e += blockDim.x) {
		int b = e / L, l = e % L;
		long long o = ((long long)b * C + c) * L + l;
		if (dx) {
			dx[o] += w[c] * dout[o];
		}
		acc += (double)dout[o] * (double)x[o];
	}
	acc = block_sum_f64(acc, scratch);
	if (dw && threadIdx.x == 0) {
		dw[c] += (float)acc;
	}
}

// short_conv_fwd: out[b,c,t] = bias[c] + sum_k weight[c,k] inp[b,c,t-K+1+k]
// (inputs before 0 are zero).
extern "C" __global__ void short_conv_fwd(float *out, const float *inp, const float *weight, const float *bias, int B, int C, int L, int K) {
	long long n = (long long)B * C * L;
	for (long long e = grid_stride_start(); e < n; e += grid_stride_step()) {
		int t = (int)(e % L);
		int c = (int)(e / L % C);
		const float *x = inp + (e - t);
		float acc = bias ? bias[c] : 0.0f;
		for (int k = 0; k < K; k++) {
			int s = t - K + 1 + k;
			if (s >= 0) {
				acc += weight[c * K + k] * x[s];
			}
		}
		out[e] = acc;
	}
}

// short_conv_bwd: one block per channel (grid C). dinp[b,c,s] +=
// sum_k weight[c,k] dout[b,c,s+K-1-k]; dweight[c,k] += sum_{b,t}
// dout[b,c,t] inp[b,c,t-K+1+k]; dbias[c] += sum dout.
extern "C" __global__ void short_conv_bwd(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp, const float *weight,
					  int B, int C, int L, int K) {
	__shared__ double scratch[32];
	int c = blockIdx.x;
	for (int e = threadIdx.x; e < B * L; e += blockDim.x) {
		int b = e / L, s = e % L;
		long long base = ((long long)b * C + c) * L;
		float acc = 0;
		for (int k = 0; k < K; k++) {
			int t = s + K - 1 - k;
			if (t < L) {
				acc += weight[c * K + k] * dout[base + t];
			}
		}
		if (dinp) {
			dinp[base + s] += acc;
		}
	}
	for (int k = 0; k <= K; k++) { // k == K: the bias
		double acc = 0;
		for (int e = threadIdx.x; e < B * L; e += blockDim.x) {
			int b = e / L, t = e % L;
			long long base = ((long long)b * C + c) * L;
			if (k == K) {
				acc += dout[base + t];
			} else {
				int s = t - K + 1 + k;
				if (s >= 0) {
					acc += (double)dout[base + t] * (double)inp[base + s];
				}
			}
		}
		acc = block_sum_f64(acc, scratch);
		if (threadIdx.x == 0) {
			if (k == K) {
				if (dbias) {
					dbias[c] += (float)acc;
				}
			} else if (dweight) {
				dweight[c * K + k] += (float)acc;
			}
		}
	}
}

// short_conv_step advances the convolution by one position: state
// [B, C, K-1] (oldest first), inp and out [B, C].
extern "C" __global__ void short_conv_step(float *out, float *state, const float *inp, const float *weight, const float *bias, int B, int C, int K) {
	long long n = (long long)B * C;
	for (long long e = grid_stride_start(); e < n; e += grid_stride_step()) {
		int c = (int)(e % C);
		float *st = state + e * (K - 1);
		float acc = bias ? bias[c] : 0.0f;
		for (int k = 0; k < K - 1; k++) {
			acc += weight[c * K + k] * st[k];
		}
		float x = inp[e];
		acc += weight[c * K + K - 1] * x;
		for (int k = 0; k + 1 < K - 1; k++) {
			st[k] = st[k + 1];
		}
		if (K > 1) {
			st[K - 2] = x;
		}
		out[e] = acc;
	}
}

// sin_fwd: out[i,j] = sin(freq[j] inp[i,j]); out may alias inp.
extern "C" __global__ void sin_fwd(float *out, const float *inp, const float *freq, int N, int C) {
	long long n = (long long)N * C;
	for (long long e = grid_stride_start(); e < n; e += grid_stride_step()) {
		out[e] = sinf(freq[e % C] * inp[e]);
	}
}

// sin_bwd_dx: dinp += dout freq cos(freq inp).
extern "C" __global__ void sin_bwd_dx(float *dinp, const float *dout, const float *inp, const float *freq, int N, int C) {
	long long n = (long long)N * C;
	for (long long e = grid_stride_start(); e < n; e += grid_stride_step()) {
		float f = freq[e % C];
		dinp[e] += dout[e] * f * cosf(f * inp[e]);
	}
}

// sin_dfreq_partial writes part[p, j] = sum over its rows of
// dout inp cos(freq inp), in float64 (reduced by col_reduce_f64).
extern "C" __global__ void sin_dfreq_partial(double *part, const float *dout, const float *inp, const float *freq, int N, int C, int rows) {
	int j = blockIdx.x * blockDim.x + threadIdx.x;
	int p = blockIdx.y;
	if (j >= C) {
		return;
	}
	float f = freq[j];
	double a = 0;
	int end = min(N, (p + 1) * rows);
	for (int i = p * rows; i < end; i++) {
		long long o = (long long)i * C + j;
		a += (double)dout[o] * (double)inp[o] * (double)cosf(f * inp[o]);
	}
	part[(long long)p * C + j] = a;
}
