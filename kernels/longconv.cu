// longconv.cu: causal depthwise long convolutions of Hyena-style models
// (backend.LongConv) computed directly, O(L^2) per channel: one thread per
// output element, the sum in a fixed order. (FFT convolution and the
// flash-inference tiles are still to come; see internal/longconv for the
// CPU's FFT path.) x, y, dx, dy are [B, C, L]; h, dh [C, L].
#include "common.cuh"

// causal_conv_fwd: y[b,c,t] = sum_{s<=t} h[c][t-s] x[b,c,s].
extern "C" __global__ void causal_conv_fwd(float *y, const float *x, const float *h, int B, int C, int L) {
	long long n = (long long)B * C * L;
	for (long long e = grid_stride_start(); e < n; e += grid_stride_step()) {
		int t = (int)(e % L);
		int c = (int)(e / L % C);
		const float *xr = x + (e - t);
		const float *hr = h + (long long)c * L;
		float acc = 0;
		for (int s = 0; s <= t; s++) {
			acc += hr[t - s] * xr[s];
		}
		y[e] = acc;
	}
}

// causal_conv_bwd_dx: dx[b,c,s] += sum_{t>=s} h[c][t-s] dy[b,c,t].
extern "C" __global__ void causal_conv_bwd_dx(float *dx, const float *dy, const float *h, int B, int C, int L) {
	long long n = (long long)B * C * L;
	for (long long e = grid_stride_start(); e < n; e += grid_stride_step()) {
		int s = (int)(e % L);
		int c = (int)(e / L % C);
		const float *dr = dy + (e - s);
		const float *hr = h + (long long)c * L;
		float acc = 0;
		for (int t = s; t < L; t++) {
			acc += hr[t - s] * dr[t];
		}
		dx[e] += acc;
	}
}

// causal_conv_bwd_dh: dh[c][k] += sum_b sum_{t>=k} dy[b,c,t] x[b,c,t-k],
// accumulated in float64, one thread per (c, k).
extern "C" __global__ void causal_conv_bwd_dh(float *dh, const float *dy, const float *x, int B, int C, int L) {
	long long n = (long long)C * L;
	for (long long e = grid_stride_start(); e < n; e += grid_stride_step()) {
		int k = (int)(e % L);
		int c = (int)(e / L);
		double acc = 0;
		for (int b = 0; b < B; b++) {
			long long row = ((long long)b * C + c) * L;
			for (int t = k; t < L; t++) {
				acc += (double)dy[row + t] * (double)x[row + t - k];
			}
		}
		dh[e] += (float)acc;
	}
}
