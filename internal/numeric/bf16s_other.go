//go:build !amd64

package numeric

func float32sToBF16Vec(dst []uint16, src []float32) int { return 0 }

func bf16sToFloat32Vec(dst []float32, src []uint16) int { return 0 }
