// elementwise.cu: memory-bound elementwise kernels (Add, Axpy, Scale, Mul,
// fills, dtype conversions), one thread per element over a grid-stride
// loop, any block size.
#include "common.cuh"

extern "C" __global__ void add_f32(float *out, const float *a, const float *b, long long n) {
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		out[i] = a[i] + b[i];
	}
}

extern "C" __global__ void axpy_f32(float *y, float alpha, const float *x, long long n) {
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		y[i] += alpha * x[i];
	}
}

extern "C" __global__ void scale_f32(float *x, float alpha, long long n) {
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		x[i] *= alpha;
	}
}

extern "C" __global__ void mul_f32(float *out, const float *a, const float *b, long long n) {
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		out[i] = a[i] * b[i];
	}
}

// mul_bwd_f32 accumulates da += dout*b and db += dout*a; a null gradient
// is skipped.
extern "C" __global__ void mul_bwd_f32(float *da, float *db, const float *dout, const float *a, const float *b, long long n) {
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		float d = dout[i];
		if (da) {
			da[i] += d * b[i];
		}
		if (db) {
			db[i] += d * a[i];
		}
	}
}

// fill_f32 sets n elements to v (the cross-entropy reset uses a pattern
// of three).
extern "C" __global__ void fill_f32(float *x, float v, long long n) {
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		x[i] = v;
	}
}

// cast_f32_to_bf16 rounds n float32 to bfloat16, nearest even (as
// internal/numeric.Float32ToBF16).
extern "C" __global__ void cast_f32_to_bf16(bf16_t *out, const float *in, long long n) {
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		out[i] = f32_to_bf16(in[i]);
	}
}

// cast_bf16_to_f32 widens n bfloat16 exactly.
extern "C" __global__ void cast_bf16_to_f32(float *out, const bf16_t *in, long long n) {
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		out[i] = bf16_to_f32(in[i]);
	}
}

// sum_squares_partial writes, for each block, the float64 sum of squares of
// its grid-stride share of x into part[blockIdx.x]. Block size: a multiple
// of 32. The block sums are added in order by sum_f64 (one block), so the
// result depends only on the launch shape.
extern "C" __global__ void sum_squares_partial(double *part, const float *x, long long n) {
	__shared__ double scratch[32];
	double s = 0;
	for (long long i = grid_stride_start(); i < n; i += grid_stride_step()) {
		double v = x[i];
		s += v * v;
	}
	s = block_sum_f64(s, scratch);
	if (threadIdx.x == 0) {
		part[blockIdx.x] = s;
	}
}

// sum_f64 adds n doubles in index order into out[0] (one thread).
extern "C" __global__ void sum_f64(double *out, const double *x, int n) {
	if (blockIdx.x != 0 || threadIdx.x != 0) {
		return;
	}
	double s = 0;
	for (int i = 0; i < n; i++) {
		s += x[i];
	}
	out[0] = s;
}
