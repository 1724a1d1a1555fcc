//go:build !cgo

package cudart

// Without cgo the loaders fail with ErrNoCgo; the types exist so that
// callers compile.

// Handles of the driver API.
type (
	Context  uintptr
	Module   uintptr
	Function uintptr
	Stream   uintptr
	Event    uintptr
	DevPtr   uint64
	Comm     uintptr
)

// Driver is the CUDA driver API (unavailable without cgo).
type Driver struct{ Lib *Library }

// LoadDriver returns ErrNoCgo.
func LoadDriver() (*Driver, error) { return nil, ErrNoCgo }

// NVRTC is the runtime compiler (unavailable without cgo).
type NVRTC struct{ Lib *Library }

// LoadNVRTC returns ErrNoCgo.
func LoadNVRTC() (*NVRTC, error) { return nil, ErrNoCgo }

// BlasLt is a cuBLASLt handle (unavailable without cgo).
type BlasLt struct{ Lib *Library }

// NewBlasLt returns ErrNoCgo.
func NewBlasLt() (*BlasLt, error) { return nil, ErrNoCgo }

// NCCL is libnccl (unavailable without cgo).
type NCCL struct{ Lib *Library }

// LoadNCCL returns ErrNoCgo.
func LoadNCCL() (*NCCL, error) { return nil, ErrNoCgo }
