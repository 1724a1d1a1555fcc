//go:build cgo

package emu

import (
	"math"
	"strings"
	"testing"
	"unsafe"

	"github.com/titan-go/titan/internal/backend/cuda"
	"github.com/titan-go/titan/internal/testenv"
)

// selfTest are kernels that check the emulator's model of CUDA: a barrier
// every thread reaches, one that only some do, a shared-memory read that
// lacks its barrier, and warp shuffles over a partial last warp.
const selfTest = `
extern "C" __global__ void t_neighbour(int *out, int sync) {
	__shared__ int s[256];
	int i = threadIdx.x;
	s[i] = i * 3 + blockIdx.x;
	if (sync) {
		__syncthreads();
	}
	out[blockIdx.x * blockDim.x + i] = s[(i + 1) % blockDim.x];
}
extern "C" __global__ void t_divergent(int *out) {
	float v = 1;
	if (threadIdx.x == 0) {
		__syncthreads(); // waits for lanes that wait for it in the shuffle
	} else {
		v = warp_sum(v);
	}
	out[threadIdx.x] = (int)v;
}
extern "C" __global__ void t_shuffle(float *out) {
	float v = (float)(threadIdx.x + 1);
	float s = warp_sum(v);
	float m = warp_max(v);
	float d = __shfl_down_sync(0xffffffffu, v, 1);
	out[3 * threadIdx.x] = s;
	out[3 * threadIdx.x + 1] = m;
	out[3 * threadIdx.x + 2] = d;
}
extern "C" __global__ void t_early_exit(int *out, int n) {
	__shared__ int s[64];
	int i = threadIdx.x;
	if (i >= n) {
		return; // exited threads no longer count at the barrier
	}
	s[i] = i;
	__syncthreads();
	out[i] = s[n - 1 - i];
}
`

func buildSelfTest(t *testing.T) *Device {
	t.Helper()
	_, err := Compiler()
	testenv.Require(t, "g++ (the emulated CUDA device compiles the kernels with it)", err == nil)
	lib, err := BuildWith(t.TempDir(), selfTest, []string{"t_neighbour", "t_divergent", "t_shuffle", "t_early_exit"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func ints(d *Device, n int) (uintptr, func() []int32) {
	p, _ := d.Malloc(4 * n)
	return p, func() []int32 {
		out := make([]int32, n)
		d.CopyDtoH(unsafe.Pointer(&out[0]), p, 4*n)
		return out
	}
}

func TestEmulator(t *testing.T) {
	d := buildSelfTest(t)
	const B, T = 3, 96
	check := func(got []int32) bool {
		for b := 0; b < B; b++ {
			for i := 0; i < T; i++ {
				if got[b*T+i] != int32((i+1)%T*3+b) {
					return false
				}
			}
		}
		return true
	}
	for _, o := range []int{Forward, Reverse, Alternate} {
		d.SetOrder(o)
		p, get := ints(d, B*T)
		if err := d.Launch("t_neighbour", cuda.Dim3{B, 1, 1}, cuda.Dim3{T, 1, 1}, p, int32(1)); err != nil {
			t.Fatal(err)
		}
		if !check(get()) {
			t.Errorf("order %d: neighbour read after __syncthreads is wrong", o)
		}
	}
	// Without the barrier, forward order runs thread i to its end before
	// thread i+1 writes: the read sees the previous block's value.
	d.SetOrder(Forward)
	p, get := ints(d, B*T)
	if err := d.Launch("t_neighbour", cuda.Dim3{B, 1, 1}, cuda.Dim3{T, 1, 1}, p, int32(0)); err != nil {
		t.Fatal(err)
	}
	if check(get()) {
		t.Error("a missing __syncthreads went unnoticed")
	}
	d.SetOrder(Alternate)

	p, _ = ints(d, 64)
	err := d.Launch("t_divergent", cuda.Dim3{1, 1, 1}, cuda.Dim3{64, 1, 1}, p)
	if err == nil || !strings.Contains(err.Error(), "deadlock") {
		t.Errorf("divergent barrier: %v, want a deadlock error", err)
	}

	const n = 45 // a full warp and a partial one
	fp, _ := d.Malloc(4 * 3 * n)
	if err := d.Launch("t_shuffle", cuda.Dim3{1, 1, 1}, cuda.Dim3{n, 1, 1}, fp); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 3*n)
	d.CopyDtoH(unsafe.Pointer(&got[0]), fp, 4*3*n)
	for i := 0; i < n; i++ {
		w0 := i / 32 * 32
		w1 := min(w0+32, n)
		var sum, mx float32
		for j := w0; j < w1; j++ {
			sum += float32(j + 1)
			mx = float32(math.Max(float64(mx), float64(j+1)))
		}
		down := float32(i + 2)
		if i+1 >= w1 {
			down = float32(i + 1)
		}
		if i < 32 && (got[3*i] != sum || got[3*i+1] != mx || got[3*i+2] != down) {
			t.Errorf("lane %d: sum %v max %v down %v, want %v %v %v", i, got[3*i], got[3*i+1], got[3*i+2], sum, mx, down)
		}
	}

	p, get = ints(d, 64)
	if err := d.Launch("t_early_exit", cuda.Dim3{1, 1, 1}, cuda.Dim3{64, 1, 1}, p, int32(40)); err != nil {
		t.Fatal(err)
	}
	for i, v := range get()[:40] {
		if v != int32(39-i) {
			t.Fatalf("early exit: out[%d] = %d, want %d", i, v, 39-i)
		}
	}
	if err := d.Launch("no_such_kernel", cuda.Dim3{1, 1, 1}, cuda.Dim3{1, 1, 1}); err == nil || !strings.Contains(err.Error(), "no kernel named no_such_kernel") {
		t.Errorf("unknown kernel: %v", err)
	}
}
