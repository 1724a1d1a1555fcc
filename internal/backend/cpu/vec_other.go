//go:build !amd64

package cpu

import "math"

// useAVX2 is always false off amd64; the tests toggle it on every
// architecture.
var useAVX2 = false

// expBlocks leaves every block to expBlockGo on machines without a vector
// kernel.
func expBlocks(dst, src []float32, a, c float32, acc *[expLanes]float32) int { return 0 }

// sigmoidBlocks leaves every block to the scalar code.
func sigmoidBlocks(dst, src []float32) int { return 0 }

// maxBlocks leaves every element to the scalar code.
func maxBlocks(x []float32) (float32, int) { return float32(math.Inf(-1)), 0 }
