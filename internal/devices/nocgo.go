//go:build !cgo

package devices

// Detect cannot load NVML without cgo.
func Detect() (Report, error) {
	return Report{}, &NoGPUError{Reason: "titan was built without cgo: the CUDA backend needs CGO_ENABLED=1"}
}
