package devices

import "fmt"

// arch is one GPU architecture's throughput per SM and clock.
type arch struct {
	coresPerSM int // float32 CUDA cores per SM
	// tensorBF16 is dense bfloat16 (float16 where bfloat16 is missing)
	// tensor-core FLOP per SM per clock with float32 accumulation.
	tensorBF16 int
}

// archOf returns the architecture of compute capability major.minor.
// The figures are NVIDIA's architecture whitepapers' per-SM rates; a GPU's
// peak follows from its SM count and clock, never from a per-product
// table.
func archOf(major, minor int) (arch, bool) {
	switch {
	case major == 7 && minor == 0: // Volta (V100): float16 only
		return arch{64, 1024}, true
	case major == 7 && minor == 5: // Turing
		return arch{64, 512}, true
	case major == 8 && minor == 0: // Ampere A100
		return arch{64, 2048}, true
	case major == 8 && (minor == 6 || minor == 7 || minor == 9): // Ampere GA10x, Orin, Ada
		return arch{128, 512}, true
	case major == 9 && minor == 0: // Hopper
		return arch{128, 4096}, true
	case major == 10: // Blackwell datacenter (B200, GB200)
		return arch{128, 8192}, true
	case major == 12: // Blackwell GeForce/workstation
		return arch{128, 512}, true
	}
	return arch{}, false
}

// CoresPerSM is the float32 CUDA cores per SM (0 for an unknown
// architecture).
func CoresPerSM(major, minor int) int {
	a, _ := archOf(major, minor)
	return a.coresPerSM
}

// Peak returns the dense peak FLOP/s of a GPU of compute capability
// major.minor with sms SMs at clockMHz: bfloat16 tensor cores and plain
// float32 (an FMA is two FLOPs).
func Peak(major, minor, sms, clockMHz int) (bf16, f32 float64, err error) {
	a, ok := archOf(major, minor)
	if !ok {
		return 0, 0, fmt.Errorf("no throughput figures for compute capability %d.%d", major, minor)
	}
	if sms <= 0 || clockMHz <= 0 {
		return 0, 0, fmt.Errorf("peak of sm_%d%d needs the SM count and clock (got %d SMs at %d MHz)", major, minor, sms, clockMHz)
	}
	hz := float64(sms) * float64(clockMHz) * 1e6
	return hz * float64(a.tensorBF16), hz * 2 * float64(a.coresPerSM), nil
}
