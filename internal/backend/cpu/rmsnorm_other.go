//go:build !amd64

package cpu

// useRMSNormAVX512 is always false off amd64; the tests toggle it on
// every architecture.
var useRMSNormAVX512 = false

// rmsSumSquaresVec leaves the sum to the scalar code.
func rmsSumSquaresVec(x []float32) (float32, bool) { return 0, false }

// rmsDot3Vec leaves the sum to the scalar code.
func rmsDot3Vec(a, b, c []float32) (float32, bool) { return 0, false }

// rmsScaleBlocks leaves every element to the scalar code.
func rmsScaleBlocks(out, x, w []float32, r float32) int { return 0 }

// rmsBackRowBlocks leaves every element to the scalar code.
func rmsBackRowBlocks(dx, d, x, w []float32, r, k float32) int { return 0 }

// rmsDweightBlocks leaves every column to the scalar code.
func rmsDweightBlocks(acc *[rmsStrip]float64, d, x, rs []float32, N, C, c0, c1 int) int { return 0 }
