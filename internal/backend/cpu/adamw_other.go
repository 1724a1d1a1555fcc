//go:build !amd64

package cpu

const adamwConsts = 9

var useAdamWAVX2 = false

// adamwBlocks leaves every element to the scalar loop.
func adamwBlocks(p, g, m, v []float32, k *[adamwConsts][8]float32) int { return 0 }
