package randstream

import (
	"math"
	"testing"
)

// TestMoments checks each stream's mean and variance over many elements
// against the distribution's, within five standard errors.
func TestMoments(t *testing.T) {
	const n = 200000
	key := Key("layers.0.attention.wq.weight", 7)
	cut := 2.0
	// The variance of N(0,1) truncated to [-2, 2].
	phi := math.Exp(-cut*cut/2) / math.Sqrt(2*math.Pi)
	truncVar := 1 - 2*cut*phi/math.Erf(cut/math.Sqrt2)
	for _, tc := range []struct {
		name     string
		f        func(i uint64) float64
		mean, vr float64
		lo, hi   float64
	}{
		{"Gaussian", func(i uint64) float64 { return Gaussian(key, i) }, 0, 1, math.Inf(-1), math.Inf(1)},
		{"TruncGaussian", func(i uint64) float64 { return TruncGaussian(key, i, 1, cut) }, 0, truncVar, -cut, cut},
		{"Uniform", func(i uint64) float64 { return Uniform(key, i) }, 0.5, 1.0 / 12, 0, 1},
	} {
		var s, s2 float64
		for i := uint64(0); i < n; i++ {
			x := tc.f(i)
			if x < tc.lo || x > tc.hi || (tc.name == "Uniform" && x == 1) {
				t.Fatalf("%s: element %d = %v outside [%v, %v]", tc.name, i, x, tc.lo, tc.hi)
			}
			s += x
			s2 += x * x
		}
		mean := s / n
		vr := s2/n - mean*mean
		se := math.Sqrt(tc.vr / n)
		if math.Abs(mean-tc.mean) > 5*se {
			t.Errorf("%s: mean %.5f, want %.5f ± %.5f", tc.name, mean, tc.mean, 5*se)
		}
		if math.Abs(vr-tc.vr) > 0.02*tc.vr {
			t.Errorf("%s: variance %.5f, want %.5f within 2%%", tc.name, vr, tc.vr)
		}
	}
}

// TestKeysDiffer checks that names and seeds select different streams.
func TestKeysDiffer(t *testing.T) {
	seen := map[uint64]string{}
	for _, name := range []string{"a", "b", "tok_embeddings.weight", "output.weight"} {
		for seed := uint64(0); seed < 4; seed++ {
			k := Key(name, seed)
			if prev, ok := seen[k]; ok {
				t.Fatalf("Key(%q, %d) = Key of %s", name, seed, prev)
			}
			seen[k] = name
		}
	}
}
