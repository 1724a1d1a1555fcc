//go:build !amd64

package gemm

// archKernels returns the assembly kernels this CPU supports: none outside
// amd64, where the portable kernel runs.
func archKernels() []*kernel { return nil }
