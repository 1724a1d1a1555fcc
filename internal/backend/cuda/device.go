// Package cuda is titan's GPU backend: backend.Backend on NVIDIA GPUs.
//
// The Backend drives a Device: device memory, copies, and launches of the
// kernels of package kernels (kernels/*.cu) by name with cuLaunchKernel's
// argument convention. Two Devices exist. The GPU (Open, in gpu.go) goes
// through the dlopen shim of internal/cudart: the CUDA driver API, kernels
// compiled by NVRTC for the device's architecture on first use and cached
// on disk, cuBLASLt for matrix products. The emulated device (package
// cuda/emu) runs the same kernel sources compiled for the host against
// kernels/emu/cuda_emu.h, so that the whole backend (launch shapes,
// argument marshalling and kernels) is tested against the CPU backend on
// machines without a GPU.
//
// Backend operations panic on a device error, as the CPU backend panics
// on bad dimensions: a failed launch leaves the training step
// meaningless. Every operation is queued on one stream; Sync waits for it.
package cuda

import (
	"errors"
	"unsafe"
)

// Dim3 is a grid or block shape.
type Dim3 [3]uint32

// Device is the memory and launch interface under a Backend. Device
// pointers are uintptr. Launch arguments follow cudart.PackParams: uintptr
// (pointers), int32, uint32, int64, float32, float64.
type Device interface {
	// Name describes the device ("NVIDIA H100 80GB HBM3", "emulator").
	Name() string
	Malloc(bytes int) (uintptr, error)
	Free(p uintptr) error
	// CopyHtoD and CopyDtoH copy between host memory and the device,
	// after the queued work; they return when the copy is done.
	CopyHtoD(dst uintptr, src unsafe.Pointer, bytes int) error
	CopyDtoH(dst unsafe.Pointer, src uintptr, bytes int) error
	// CopyDtoD and Memset (to zero) are queued.
	CopyDtoD(dst, src uintptr, bytes int) error
	Memset(dst uintptr, bytes int) error
	// Launch queues the kernel called name.
	Launch(name string, grid, block Dim3, args ...any) error
	// Sync waits for the queued work.
	Sync() error
}

// MatmulArgs is one (strided batched) row-major product
// C = alpha op(A) op(B) + beta C with op(A) m×k and op(B) k×n; A and B are
// both float32 or both bfloat16, C float32.
type MatmulArgs struct {
	TransA, TransB bool
	M, N, K        int
	Alpha, Beta    float32
	A, B, C        uintptr
	Lda, Ldb, Ldc  int
	SA, SB, SC     int64
	Batch          int
	BF16           bool
	TF32           bool
}

// Matmuler is a Device with a library GEMM (cuBLASLt). Without one the
// Backend runs the gemm_tiled kernel.
type Matmuler interface {
	Matmul(a MatmulArgs) error
}

// ErrNoGPU is wrapped by Open's error when no CUDA device can be used.
var ErrNoGPU = errors.New("no usable CUDA GPU")
