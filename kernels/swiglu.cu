// swiglu.cu: the SwiGLU and GELU activations and their gradients, one
// thread per element.
#include "common.cuh"

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// swiglu_fwd computes out = silu(gate) * up.
extern "C" __global__ void swiglu_fwd(float *out, const float *gate, const float *up, long long n) {
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		float g = gate[i];
		out[i] = g * sigmoidf_(g) * up[i];
	}
}

// swiglu_bwd accumulates dgate += dout*up*s*(1 + g*(1-s)) and
// dup += dout*g*s with s = sigmoid(g).
extern "C" __global__ void swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, long long n) {
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		float g = gate[i], d = dout[i], s = sigmoidf_(g);
		dgate[i] += d * up[i] * s * (1.0f + g * (1.0f - s));
		dup[i] += d * g * s;
	}
}

#define GELU_K0 0.7978845608028654f // sqrt(2/pi)
#define GELU_K1 0.044715f

// The tanh form is computed as x sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3)
// (0.5 (1 + tanh u) = sigmoid(2u)), the CPU backend's formulation.

// gelu_tanh_fwd computes 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
extern "C" __global__ void gelu_tanh_fwd(float *out, const float *inp, long long n) {
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		float x = inp[i];
		float s = sigmoidf_(2.0f * GELU_K0 * (x + GELU_K1 * x * x * x));
		out[i] = x * s;
	}
}

// gelu_tanh_bwd accumulates dinp += dout * gelu'(inp)
// = dout (s + x s (1 - s) 2 sqrt(2/pi) (1 + 3 0.044715 x^2)).
extern "C" __global__ void gelu_tanh_bwd(float *dinp, const float *dout, const float *inp, long long n) {
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		float x = inp[i];
		float s = sigmoidf_(2.0f * GELU_K0 * (x + GELU_K1 * x * x * x));
		float du = 2.0f * GELU_K0 * (1.0f + 3.0f * GELU_K1 * x * x);
		dinp[i] += dout[i] * (s + x * s * (1.0f - s) * du);
	}
}
