// adamw.cu: PyTorch's AdamW step, one thread per element, with the
// operations and roundings of the CPU backend's scalar loop
// (internal/backend/cpu/adamw.go): the _rn intrinsics keep the compiler
// from fusing multiplies and adds, so that both backends give the same
// bits (the first moment is one fused multiply-add on both).
#include "common.cuh"

extern "C" __global__ void adamw_f32(float *params, const float *grads, float *m, float *v, long long n,
				     float gradScale, float decay, float beta1, float omb1, float beta2, float omb2,
				     float bc2Sqrt, float eps, float negStep) {
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		float g = __fmul_rn(grads[i], gradScale);
		float p = __fmul_rn(params[i], decay);
		float mi = __fmaf_rn(g, omb1, __fmul_rn(m[i], beta1));
		float vi = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(__fmul_rn(omb2, g), g));
		float denom = __fadd_rn(sqrtf(vi) / bc2Sqrt, eps);
		params[i] = __fadd_rn(p, __fmul_rn(negStep, mi) / denom);
		m[i] = mi;
		v[i] = vi;
	}
}
