package cudart

import "fmt"

// Error is a failed call of an NVIDIA library.
type Error struct {
	Call string // the function, e.g. "cuMemAlloc_v2"
	Code int    // its status
	Name string // the status's name, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Log  string // extra detail (a compiler log), may be empty
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, e.Code)
	if e.Log != "" {
		s += "\n" + e.Log
	}
	return s
}

// cuResultNames are the CUresult values of the driver API that titan may
// see (cuda.h).
var cuResultNames = map[int]string{
	0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
	3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED", 5: "CUDA_ERROR_PROFILER_DISABLED",
	34: "CUDA_ERROR_STUB_LIBRARY", 46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
	100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE", 102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
	200: "CUDA_ERROR_INVALID_IMAGE", 201: "CUDA_ERROR_INVALID_CONTEXT", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	214: "CUDA_ERROR_ECC_UNCORRECTABLE", 218: "CUDA_ERROR_INVALID_PTX", 222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	300: "CUDA_ERROR_INVALID_SOURCE", 301: "CUDA_ERROR_FILE_NOT_FOUND", 400: "CUDA_ERROR_INVALID_HANDLE",
	500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS",
	701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", 702: "CUDA_ERROR_LAUNCH_TIMEOUT", 719: "CUDA_ERROR_LAUNCH_FAILED",
	801: "CUDA_ERROR_NOT_SUPPORTED", 803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", 999: "CUDA_ERROR_UNKNOWN",
}

var nvrtcResultNames = map[int]string{
	0: "NVRTC_SUCCESS", 1: "NVRTC_ERROR_OUT_OF_MEMORY", 2: "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
	3: "NVRTC_ERROR_INVALID_INPUT", 4: "NVRTC_ERROR_INVALID_PROGRAM", 5: "NVRTC_ERROR_INVALID_OPTION",
	6: "NVRTC_ERROR_COMPILATION", 7: "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
	8: "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION", 9: "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
	10: "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID", 11: "NVRTC_ERROR_INTERNAL_ERROR",
}

var cublasStatusNames = map[int]string{
	0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
	7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
	13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED",
	16: "CUBLAS_STATUS_LICENSE_ERROR",
}

var ncclResultNames = map[int]string{
	0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
	4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress",
}

// statusError returns nil for status 0, else an *Error naming call.
func statusError(call string, code int, names map[int]string) error {
	if code == 0 {
		return nil
	}
	name, ok := names[code]
	if !ok {
		name = "unknown status"
	}
	return &Error{Call: call, Code: code, Name: name}
}

func cuErr(call string, code int) error     { return statusError(call, code, cuResultNames) }
func nvrtcErr(call string, code int) error  { return statusError(call, code, nvrtcResultNames) }
func cublasErr(call string, code int) error { return statusError(call, code, cublasStatusNames) }
func ncclErr(call string, code int) error   { return statusError(call, code, ncclResultNames) }

// LibraryError is a library that could not be loaded.
type LibraryError struct {
	Lib   string   // what was wanted, e.g. "libcuda.so.1"
	Tried []string // every path tried, with the loader's reason
}

func (e *LibraryError) Error() string {
	s := fmt.Sprintf("cannot load %s (set %s to the folder that holds it); tried:", e.Lib, LibPathEnv)
	for _, t := range e.Tried {
		s += "\n  " + t
	}
	return s
}

// SymbolError is a function missing from a loaded library.
type SymbolError struct {
	Lib, Path, Symbol string
}

func (e *SymbolError) Error() string {
	return fmt.Sprintf("%s (loaded from %s) has no symbol %s: the library is too old or not the one titan expects", e.Lib, e.Path, e.Symbol)
}
