// Package cudart is titan's shim to the NVIDIA libraries: the CUDA driver
// API (libcuda.so.1), NVRTC (libnvrtc.so), cuBLASLt (libcublasLt.so) and
// NCCL (libnccl.so.2).
//
// Nothing NVIDIA's is needed at build time: the package declares the few
// types and functions it calls itself (as C function-pointer types, in the
// cgo preambles) and dlopens the libraries at run time, as go-nvml does for
// NVML. Every status the libraries return becomes an *Error naming the
// call ("cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)"); a library or symbol
// that cannot be found is an error that says which, and where the search
// looked.
//
// Libraries are searched, in order, in the folders of TITAN_CUDA_LIB_PATH
// (colon-separated), in the lib folders of the NVIDIA wheels (nvidia/*/lib)
// under the Python site-packages folders (TITAN_PYTHON_SITE_PACKAGES, the
// active virtual environment, the usual system and user locations), and
// finally by bare name through the system loader (LD_LIBRARY_PATH,
// ld.so.cache).
//
// Built with CGO_ENABLED=0 the package still compiles, and every entry
// point returns ErrNoCgo.
package cudart

import "errors"

// ErrNoCgo is returned by every entry point of a build without cgo.
var ErrNoCgo = errors.New("titan was built without cgo: the CUDA backend needs CGO_ENABLED=1")
