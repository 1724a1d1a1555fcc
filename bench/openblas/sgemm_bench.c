// sgemm_bench times OpenBLAS cblas_sgemm on the shapes of the Go benchmark
// BenchmarkSgemm (internal/backend/cpu/gemm/gemm_bench_test.go), row-major
// with the same transposes and beta, and prints one line per shape:
//
//	<name> <GFLOP/s>
//
// under the same names. Batched shapes call cblas_sgemm once per matrix.
//
// Build: gcc -O2 -o sgemm_bench sgemm_bench.c -lopenblas
// Usage: sgemm_bench [seconds per shape, default 1] [shape name]
//        sgemm_bench list    (prints the shape names)
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct shape {
	int transA, transB;
	int m, n, k;
	float beta;
	int batch; // 0: one plain multiplication
};

// Keep in step with benchShapes in gemm_bench_test.go.
static const struct shape shapes[] = {
	{0, 0, 1024, 1024, 1024, 0, 0},
	{0, 0, 4096, 5632, 2048, 0, 0},
	{0, 1, 2048, 768, 768, 0, 0},
	{0, 1, 2048, 2000, 768, 0, 0},
	{0, 1, 2048, 768, 2000, 0, 0},
	{0, 1, 2048, 256, 768, 0, 0},
	{0, 0, 2048, 768, 2000, 1, 0},
	{0, 0, 2048, 2000, 768, 1, 0},
	{0, 0, 2048, 768, 256, 1, 0},
	{1, 0, 768, 768, 2048, 1, 0},
	{1, 0, 2000, 768, 2048, 1, 0},
	{1, 0, 768, 2000, 2048, 1, 0},
	{1, 0, 256, 768, 2048, 1, 0},
	{0, 1, 256, 256, 64, 0, 24},
	{0, 0, 256, 64, 256, 0, 24},
	{0, 1, 64, 64, 64, 0, 96},
};

// shape_name formats the Go benchmark's sub-benchmark name of s.
static void shape_name(const struct shape *s, char *buf, size_t len) {
	char op[4] = {s->transA ? 'T' : 'N', s->transB ? 'T' : 'N', 0, 0};
	if (s->batch > 0) {
		snprintf(buf, len, "b%s_%dx%dx%dx%d%s", op, s->batch, s->m, s->n, s->k, s->beta != 0 ? "_acc" : "");
	} else {
		snprintf(buf, len, "%s_%dx%dx%d%s", op, s->m, s->n, s->k, s->beta != 0 ? "_acc" : "");
	}
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static float *random_matrix(size_t n) {
	float *p = aligned_alloc(64, ((n * sizeof(float)) + 63) / 64 * 64);
	if (p == NULL) {
		fprintf(stderr, "sgemm_bench: out of memory for %zu floats\n", n);
		exit(1);
	}
	for (size_t i = 0; i < n; i++) {
		p[i] = (float)rand() / RAND_MAX - 0.5f;
	}
	return p;
}

static void run(const struct shape *s, const float *a, const float *b, float *c) {
	int lda = s->transA ? s->m : s->k;
	int ldb = s->transB ? s->k : s->n;
	size_t sa = (size_t)s->m * s->k, sb = (size_t)s->k * s->n, sc = (size_t)s->m * s->n;
	int count = s->batch > 0 ? s->batch : 1;
	for (int i = 0; i < count; i++) {
		cblas_sgemm(CblasRowMajor, s->transA ? CblasTrans : CblasNoTrans, s->transB ? CblasTrans : CblasNoTrans,
		            s->m, s->n, s->k, 1.0f, a + i * sa, lda, b + i * sb, ldb, s->beta, c + i * sc, s->n);
	}
}

int main(int argc, char **argv) {
	if (argc > 1 && strcmp(argv[1], "list") == 0) {
		for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
			char name[64];
			shape_name(&shapes[i], name, sizeof name);
			printf("%s\n", name);
		}
		return 0;
	}
	double seconds = argc > 1 ? atof(argv[1]) : 1.0;
	const char *filter = argc > 2 ? argv[2] : "";
	if (seconds <= 0) {
		fprintf(stderr, "sgemm_bench: bad seconds %s\n", argv[1]);
		return 2;
	}
	fprintf(stderr, "# OpenBLAS %s, core %s, %d threads\n", openblas_get_config(), openblas_get_corename(),
	        openblas_get_num_threads());
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
		const struct shape *s = &shapes[i];
		char name[64];
		shape_name(s, name, sizeof name);
		if (filter[0] != 0 && strcmp(name, filter) != 0) {
			continue;
		}
		int count = s->batch > 0 ? s->batch : 1;
		float *a = random_matrix((size_t)count * s->m * s->k);
		float *b = random_matrix((size_t)count * s->k * s->n);
		float *c = random_matrix((size_t)count * s->m * s->n);
		run(s, a, b, c); // warm up: threads, page faults
		long reps = 0;
		double start = now(), elapsed;
		do {
			run(s, a, b, c);
			reps++;
			elapsed = now() - start;
		} while (elapsed < seconds || reps < 3);
		double flops = 2.0 * s->m * s->n * (double)s->k * count * reps;
		printf("%s %.1f\n", name, flops / elapsed / 1e9);
		fflush(stdout);
		free(a);
		free(b);
		free(c);
	}
	return 0;
}
