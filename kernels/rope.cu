// rope.cu: rotary position embeddings on interleaved pairs (x[2i], x[2i+1])
// of every head of [B, T, NH, HD], and the tables with Llama 3.1's
// frequency scaling (internal/model/llama Config.RoPEFrequencies).
#include "common.cuh"

// rope_fwd: out[2i] = x0 cos - x1 sin, out[2i+1] = x0 sin + x1 cos, with
// cos/sin[t, i] from tables [T, HD/2]; out may alias inp. One thread per
// pair.
extern "C" __global__ void rope_fwd(float *out, const float *inp, const float *cos_, const float *sin_, int B, int T, int NH, int HD) {
	int half = HD / 2;
	long long n = (long long)B * T * NH * half;
	for (long long p = grid_stride_start(); p < n; p += grid_stride_step()) {
		int i = (int)(p % half);
		long long bth = p / half; // (b*T + t)*NH + h
		int t = (int)(bth / NH % T);
		long long off = bth * HD + 2 * i;
		float c = cos_[t * half + i], s = sin_[t * half + i];
		float x0 = inp[off], x1 = inp[off + 1];
		out[off] = x0 * c - x1 * s;
		out[off + 1] = x0 * s + x1 * c;
	}
}

// rope_bwd accumulates the inverse rotation:
// dinp[2i] += d0 cos + d1 sin, dinp[2i+1] += d1 cos - d0 sin.
extern "C" __global__ void rope_bwd(float *dinp, const float *dout, const float *cos_, const float *sin_, int B, int T, int NH, int HD) {
	int half = HD / 2;
	long long n = (long long)B * T * NH * half;
	for (long long p = grid_stride_start(); p < n; p += grid_stride_step()) {
		int i = (int)(p % half);
		long long bth = p / half;
		int t = (int)(bth / NH % T);
		long long off = bth * HD + 2 * i;
		float c = cos_[t * half + i], s = sin_[t * half + i];
		float d0 = dout[off], d1 = dout[off + 1];
		dinp[off] += d0 * c + d1 * s;
		dinp[off + 1] += d1 * c - d0 * s;
	}
}

// rope_freq returns the frequency of pair i of a head of HD elements:
// theta^(-2i/HD), with Llama 3.1's scaling when factor is not 0 (wave
// lengths below orig/highFreq kept, above orig/lowFreq divided by factor,
// smoothly interpolated between).
__device__ __forceinline__ double rope_freq(int i, int HD, double theta, double factor, double lowFreq, double highFreq, double orig) {
	double f = 1.0 / pow(theta, (double)(2 * i) / (double)HD);
	if (factor != 0) {
		double lowWave = orig / lowFreq, highWave = orig / highFreq;
		double wave = 2 * 3.141592653589793 / f;
		if (wave < highWave) {
		} else if (wave > lowWave) {
			f /= factor;
		} else {
			double smooth = (orig / wave - lowFreq) / (highFreq - lowFreq);
			f = (1 - smooth) * f / factor + smooth * f;
		}
	}
	return f;
}

// rope_tables fills cos/sin [T, HD/2] with cos and sin of (pos0+t)*freq_i,
// in float64 and rounded once (as Config.RoPETables).
extern "C" __global__ void rope_tables(float *cos_, float *sin_, int T, int HD, int pos0, double theta, double factor, double lowFreq, double highFreq, double orig) {
	int half = HD / 2;
	long long n = (long long)T * half;
	for (long long p = grid_stride_start(); p < n; p += grid_stride_step()) {
		int i = (int)(p % half);
		int t = (int)(p / half);
		double a = (double)(pos0 + t) * rope_freq(i, HD, theta, factor, lowFreq, highFreq, orig);
		cos_[p] = (float)cos(a);
		sin_[p] = (float)sin(a);
	}
}
