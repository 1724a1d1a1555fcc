// Package devices finds the GPUs of the machine (through NVML, with
// github.com/NVIDIA/go-nvml, which dlopens libnvidia-ml itself), describes
// them for `titan devices`, resolves training.device, and computes each
// GPU's peak throughput for MFU from its architecture, SM count and clock.
package devices

import (
	"fmt"
	"io"
	"strings"
)

// GPU is one GPU as NVML reports it.
type GPU struct {
	Index          int
	Name, UUID     string
	Major, Minor   int // compute capability
	Cores          int // CUDA cores (0: unknown)
	MemTotal       uint64
	MemUsed        uint64
	UtilGPU        int // percent of the last sample period a kernel ran
	UtilMem        int // percent of it memory was read or written
	SMClockMHz     int
	MaxSMClockMHz  int
	MemClockMHz    int
	NVLinks        int // active NVLink links
	PowerW         float64
	TemperatureC   int
	PCIBusID       string
	PeakBF16FLOPS  float64 // 0: unknown architecture
	PeakFloat32FLP float64
}

// SMs is the number of streaming multiprocessors (0 when unknown).
func (g GPU) SMs() int {
	per := CoresPerSM(g.Major, g.Minor)
	if per == 0 || g.Cores == 0 {
		return 0
	}
	return g.Cores / per
}

// Report is what Detect found.
type Report struct {
	Driver string // driver version
	NVML   string // NVML version
	GPUs   []GPU
}

// NoGPUError says why no GPU was found.
type NoGPUError struct{ Reason string }

func (e *NoGPUError) Error() string { return "no GPU found (" + e.Reason + ")" }

// Print writes a report in the form of `titan devices`; err is Detect's.
func Print(w io.Writer, r Report, err error) {
	if err != nil {
		fmt.Fprintln(w, err)
		return
	}
	fmt.Fprintf(w, "driver %s, NVML %s, %d GPU(s)\n", r.Driver, r.NVML, len(r.GPUs))
	for _, g := range r.GPUs {
		fmt.Fprintf(w, "GPU %d: %s (sm_%d%d", g.Index, g.Name, g.Major, g.Minor)
		if n := g.SMs(); n > 0 {
			fmt.Fprintf(w, ", %d SMs", n)
		}
		fmt.Fprintf(w, ") %s bus %s\n", g.UUID, g.PCIBusID)
		fmt.Fprintf(w, "  memory      %.1f / %.1f GiB used\n", float64(g.MemUsed)/(1<<30), float64(g.MemTotal)/(1<<30))
		fmt.Fprintf(w, "  utilization gpu %d%%, memory %d%%\n", g.UtilGPU, g.UtilMem)
		fmt.Fprintf(w, "  clocks      sm %d MHz (max %d), memory %d MHz\n", g.SMClockMHz, g.MaxSMClockMHz, g.MemClockMHz)
		fmt.Fprintf(w, "  power       %.0f W, %d C\n", g.PowerW, g.TemperatureC)
		fmt.Fprintf(w, "  nvlink      %d active link(s)\n", g.NVLinks)
		if g.PeakBF16FLOPS > 0 {
			fmt.Fprintf(w, "  peak        %.1f TFLOPS bf16 dense, %.1f TFLOPS float32 (at %d MHz)\n", g.PeakBF16FLOPS/1e12, g.PeakFloat32FLP/1e12, g.MaxSMClockMHz)
		} else {
			fmt.Fprintf(w, "  peak        unknown for sm_%d%d\n", g.Major, g.Minor)
		}
	}
}

// Device kinds of training.device.
const (
	CPU  = "cpu"
	CUDA = "cuda"
)

// Resolve turns the training.device setting ("", "cpu", "cuda") into the
// device to train on: "" means cuda when Detect finds a GPU, else cpu;
// "cuda" without a GPU is an error naming the key and the reason.
func Resolve(setting string, detect func() (Report, error)) (string, error) {
	switch strings.ToLower(strings.TrimSpace(setting)) {
	case CPU:
		return CPU, nil
	case "":
		if r, err := detect(); err == nil && len(r.GPUs) > 0 {
			return CUDA, nil
		}
		return CPU, nil
	case CUDA:
		r, err := detect()
		if err == nil && len(r.GPUs) == 0 {
			err = &NoGPUError{Reason: "NVML lists no device"}
		}
		if err != nil {
			return "", fmt.Errorf("training.device = %q: %v", setting, err)
		}
		return CUDA, nil
	}
	return "", fmt.Errorf("training.device = %q: want \"cpu\" or \"cuda\"", setting)
}
