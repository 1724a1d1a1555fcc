//go:build amd64

package cpu

import "golang.org/x/sys/cpu"

// adamwConsts is the number of constant rows adamwAVX2 reads.
const adamwConsts = 9

// useAdamWAVX2 selects the vector AdamW; tests clear it to compare.
var useAdamWAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func adamwAVX2(params, grads, m, v *float32, n int, k *[adamwConsts][8]float32)

// adamwBlocks updates the leading multiple of eight elements with the
// vector kernel and returns how many it did.
func adamwBlocks(p, g, m, v []float32, k *[adamwConsts][8]float32) int {
	n := len(p) &^ 7
	if !useAdamWAVX2 || n == 0 {
		return 0
	}
	_, _, _ = g[n-1], m[n-1], v[n-1]
	adamwAVX2(&p[0], &g[0], &m[0], &v[0], n, k)
	return n
}
