// cuda_emu.h emulates the CUDA execution model on the host, so that the
// kernels of this folder compile with a plain C++20 compiler and run on a
// machine without a GPU:
//
//	g++ -std=c++20 -x c++ -include kernels/emu/cuda_emu.h -I kernels ...
//
// A launch runs the blocks of the grid one after the other. The threads of
// a block are fibers (ucontext) of one OS thread, scheduled cooperatively:
// a thread runs until it reaches __syncthreads, a warp operation
// (__shfl_*_sync, __syncwarp) or its end, and a barrier releases when every
// thread of the block (warp) that has not exited has reached it, as on the
// GPU. Because blocks never overlap, __shared__ variables are plain
// function statics: one copy, seen by all threads of the running block and
// inherited, uninitialised as on the GPU, by the next block.
//
// Scheduling order is selectable (cuda_emu::set_order): forward, reverse or
// alternating by phase, so that a read of shared memory that lacks its
// barrier reads stale data under one of the orders. Threads that exited
// no longer count at barriers (as on sm_70 and later). A set of threads
// that wait on each other at different barriers (a lane in __syncthreads
// while its warp waits for it in a shuffle) is reported as a deadlock
// instead of hanging; barriers are counted, not matched by source line,
// so divergent __syncthreads that happen to balance pass here although
// CUDA leaves them undefined.
#ifndef TITAN_CUDA_EMU_H
#define TITAN_CUDA_EMU_H

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <ucontext.h>
#include <utility>
#include <vector>

struct uint3 {
	unsigned x, y, z;
};
struct dim3 {
	unsigned x, y, z;
	constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The built-in index variables. The scheduler sets them before it resumes
// a thread; kernel code reads them as on the GPU.
inline uint3 threadIdx;
inline uint3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;
inline constexpr int warpSize = 32;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict

namespace cuda_emu {

// Barrier counts the threads of a block or warp that have arrived.
struct Barrier {
	int expected = 0;
	int arrived = 0;
	uint64_t gen = 0;
	void release() {
		arrived = 0;
		gen++;
	}
};

struct Fiber {
	ucontext_t ctx;
	uint3 tid;
	int warp = 0, lane = 0;
	bool done = false;
	Barrier *wait = nullptr;
	uint64_t gen = 0;
};

enum Order { Forward = 0, Reverse = 1, Alternate = 2 };

struct Scheduler {
	std::vector<Fiber> fibers;
	ucontext_t main;
	int cur = -1;
	Barrier block;
	std::vector<Barrier> warps;
	// slots hold one warp's values during a shuffle (8 bytes per lane).
	std::vector<uint64_t> slots;
	const std::function<void()> *body = nullptr;
};

inline Scheduler *sched = nullptr;
inline int order = Alternate;
inline size_t stackBytes = 64 << 10;

// stack returns the i-th fiber stack, kept from launch to launch.
inline char *stack(int i) {
	static std::vector<std::unique_ptr<char[]>> stacks;
	while (int(stacks.size()) <= i) {
		stacks.emplace_back(new char[stackBytes]);
	}
	return stacks[size_t(i)].get();
}

inline void set_order(int o) { order = o; }

inline Fiber &self() { return sched->fibers[sched->cur]; }

// wait_on blocks the running thread on b until every live member arrives.
inline void wait_on(Barrier &b) {
	if (!sched) {
		return;
	}
	Fiber &f = self();
	uint64_t g = b.gen;
	if (++b.arrived >= b.expected) {
		b.release();
		// Yield anyway, so that other threads run between phases.
		f.wait = nullptr;
		swapcontext(&f.ctx, &sched->main);
		return;
	}
	f.wait = &b;
	f.gen = g;
	swapcontext(&f.ctx, &sched->main);
}

inline void fiber_main() {
	(*sched->body)();
	Fiber &f = self();
	f.done = true;
	Barrier &w = sched->warps[f.warp];
	// An exited thread no longer counts at the barriers (as on sm_70+).
	if (--sched->block.expected > 0 && sched->block.arrived >= sched->block.expected) {
		sched->block.release();
	}
	if (--w.expected > 0 && w.arrived >= w.expected) {
		w.release();
	}
	swapcontext(&f.ctx, &sched->main);
}

// run_block runs body on every thread of the current block.
inline void run_block(const std::function<void()> &body, dim3 bd) {
	Scheduler s;
	int n = int(bd.x * bd.y * bd.z);
	s.fibers.resize(n);
	int nw = (n + 31) / 32;
	s.warps.resize(nw);
	s.slots.resize(size_t(nw) * 32);
	s.block.expected = n;
	for (int w = 0; w < nw; w++) {
		s.warps[w].expected = std::min(32, n - 32 * w);
	}
	s.body = &body;
	Scheduler *prev = sched;
	sched = &s;
	for (int i = 0; i < n; i++) {
		Fiber &f = s.fibers[i];
		f.tid = uint3{unsigned(i % bd.x), unsigned(i / bd.x % bd.y), unsigned(i / (bd.x * bd.y))};
		f.warp = i / 32;
		f.lane = i % 32;
		getcontext(&f.ctx);
		f.ctx.uc_stack.ss_sp = stack(i);
		f.ctx.uc_stack.ss_size = stackBytes;
		f.ctx.uc_link = nullptr;
		makecontext(&f.ctx, fiber_main, 0);
	}
	int left = n;
	for (int pass = 0; left > 0; pass++) {
		bool progress = false;
		bool rev = order == Reverse || (order == Alternate && pass % 2 == 1);
		for (int k = 0; k < n; k++) {
			int i = rev ? n - 1 - k : k;
			Fiber &f = s.fibers[i];
			if (f.done || (f.wait && f.wait->gen == f.gen)) {
				continue;
			}
			f.wait = nullptr;
			s.cur = i;
			threadIdx = f.tid;
			swapcontext(&s.main, &f.ctx);
			progress = true;
			if (f.done) {
				left--;
			}
		}
		if (!progress) {
			sched = prev;
			char msg[160];
			snprintf(msg, sizeof msg, "deadlock in block (%u,%u,%u): %d of %d threads wait at a barrier the others never reach",
				 blockIdx.x, blockIdx.y, blockIdx.z, left, n);
			throw std::runtime_error(msg);
		}
	}
	sched = prev;
}

// launch runs body over grid × block.
inline void launch(dim3 grid, dim3 block, const std::function<void()> &body) {
	gridDim = grid;
	blockDim = block;
	for (unsigned z = 0; z < grid.z; z++) {
		for (unsigned y = 0; y < grid.y; y++) {
			for (unsigned x = 0; x < grid.x; x++) {
				blockIdx = uint3{x, y, z};
				run_block(body, block);
			}
		}
	}
}

template <class F, class... A, size_t... I>
void call_params(F *f, void **p, std::index_sequence<I...>) {
	f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>> *>(p[I])...);
}

// Kernel calls a kernel with cuLaunchKernel-style parameters: params[i]
// points at the value of argument i.
struct Kernel {
	const char *name;
	std::function<void(void **)> call;
};

template <class... A>
Kernel kernel(const char *name, void (*f)(A...)) {
	return Kernel{name, [f](void **p) { call_params<void(A...), A...>(f, p, std::index_sequence_for<A...>{}); }};
}

// shfl exchanges one value per lane of the running warp.
template <class T>
T shfl(T v, int src, int width) {
	static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
	if (!sched) {
		return v;
	}
	Fiber &f = self();
	uint64_t *slot = &sched->slots[size_t(f.warp) * 32];
	int lane = f.lane;
	std::memcpy(&slot[lane], &v, sizeof(T));
	wait_on(sched->warps[self().warp]);
	int base = lane / width * width;
	T r = v;
	if (src >= 0 && src < width) {
		std::memcpy(&r, &slot[base + src], sizeof(T));
	}
	wait_on(sched->warps[self().warp]);
	return r;
}

} // namespace cuda_emu

inline void __syncthreads() { cuda_emu::wait_on(cuda_emu::sched->block); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
	(void)mask;
	cuda_emu::wait_on(cuda_emu::sched->warps[cuda_emu::self().warp]);
}
inline void __threadfence() {}
inline void __threadfence_block() {}

template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
	(void)mask;
	return cuda_emu::shfl(v, src % width, width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int laneMask, int width = 32) {
	(void)mask;
	int lane = cuda_emu::self().lane % width;
	return cuda_emu::shfl(v, lane ^ laneMask, width);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
	(void)mask;
	int lane = cuda_emu::self().lane % width;
	int src = lane + int(delta);
	return cuda_emu::shfl(v, src < width ? src : lane, width);
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
	(void)mask;
	int lane = cuda_emu::self().lane % width;
	int src = lane - int(delta);
	return cuda_emu::shfl(v, src >= 0 ? src : lane, width);
}

// Atomics: the threads of the emulator never run at the same time.
template <class T>
T atomicAdd(T *p, T v) {
	T old = *p;
	*p = old + v;
	return old;
}

// Device intrinsics with their IEEE meaning.
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline unsigned __float_as_uint(float x) {
	unsigned u;
	std::memcpy(&u, &x, 4);
	return u;
}
inline float __uint_as_float(unsigned u) {
	float x;
	std::memcpy(&x, &u, 4);
	return x;
}
inline int __float_as_int(float x) { return int(__float_as_uint(x)); }
inline float __int_as_float(int i) { return __uint_as_float(unsigned(i)); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
// CUDA's integer min and max (device overloads of the math library).
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }

template <class T>
T __ldg(const T *p) { return *p; }

#endif
