// Package randstream holds counter-based random numbers: every value is a
// pure function of a key and an index, so any element of a stream can be
// computed alone. Model families initialise their parameters from it
// (element i of a parameter's stream depends only on the seed, the
// parameter's name and i, so an FSDP shard, a tensor-parallel shard or a
// pipeline stage initialises on its own to the values of the whole
// model), and the data loader seeds its shuffles with SplitMix64.
package randstream

import "math"

// SplitMix64 is the finaliser of the SplitMix64 generator: a bijective
// mix of x's bits.
func SplitMix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Key is the key of the stream of the parameter named name under seed.
func Key(name string, seed uint64) uint64 {
	h := uint64(1469598103934665603) // FNV-1a
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return h ^ seed*0x9e3779b97f4a7c15
}

// Gaussian is element idx of key's stream of N(0, 1) values (Box-Muller).
func Gaussian(key, idx uint64) float64 {
	h := SplitMix64(key ^ SplitMix64(idx))
	u1 := (float64(h>>11) + 0.5) / (1 << 53)
	u2 := float64(SplitMix64(h)>>11) / (1 << 53)
	return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
}

// TruncGaussian is element idx of key's stream of N(0, std²) values
// truncated to [-cut, cut] by resampling: the first of Gaussian's
// elements 4·idx, 4·idx+1, ... that falls inside.
func TruncGaussian(key, idx uint64, std, cut float64) float64 {
	for attempt := uint64(0); ; attempt++ {
		if z := std * Gaussian(key, idx*4+attempt); math.Abs(z) <= cut {
			return z
		}
	}
}

// Uniform is element idx of key's stream of values uniform in [0, 1).
func Uniform(key, idx uint64) float64 {
	return float64(SplitMix64(key^SplitMix64(idx^0x5bd1e995))>>11) / (1 << 53)
}
