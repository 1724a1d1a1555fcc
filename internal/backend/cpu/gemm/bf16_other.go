//go:build !amd64

package gemm

// archBF16Kernels returns the bfloat16 assembly kernels this CPU
// supports: none outside amd64.
func archBF16Kernels() []*kernel { return nil }
