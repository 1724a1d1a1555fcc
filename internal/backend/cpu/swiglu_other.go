//go:build !amd64

package cpu

// useSwiGLUAVX512 is always false off amd64; the tests toggle it on every
// architecture.
var useSwiGLUAVX512 = false

// swigluLanes is the amd64 kernels' block; swigluRun never takes it here.
const swigluLanes = 16

// swigluFwdBlocks leaves every element to the scalar code.
func swigluFwdBlocks(o, g, u []float32) int { return 0 }

// swigluBwdBlocks leaves every element to the scalar code.
func swigluBwdBlocks(dg, du, d, g, u []float32) int { return 0 }
