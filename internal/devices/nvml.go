//go:build cgo

package devices

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Detect lists the GPUs through NVML. With no driver or no GPU the error
// is a *NoGPUError with the reason.
func Detect() (Report, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		reason := nvml.ErrorString(ret)
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			reason = "libnvidia-ml.so.1 not found: no NVIDIA driver is installed"
		}
		return Report{}, &NoGPUError{Reason: reason}
	}
	defer nvml.Shutdown()
	var r Report
	r.Driver, _ = nvml.SystemGetDriverVersion()
	r.NVML, _ = nvml.SystemGetNVMLVersion()
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return Report{}, &NoGPUError{Reason: "nvmlDeviceGetCount: " + nvml.ErrorString(ret)}
	}
	if n == 0 {
		return Report{}, &NoGPUError{Reason: "the NVIDIA driver (" + r.Driver + ") sees no device"}
	}
	for i := 0; i < n; i++ {
		d, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return Report{}, fmt.Errorf("nvmlDeviceGetHandleByIndex(%d): %s", i, nvml.ErrorString(ret))
		}
		g := GPU{Index: i}
		g.Name, _ = d.GetName()
		g.UUID, _ = d.GetUUID()
		g.Major, g.Minor, _ = d.GetCudaComputeCapability()
		g.Cores, _ = d.GetNumGpuCores()
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemTotal, g.MemUsed = m.Total, m.Used
		}
		if u, ret := d.GetUtilizationRates(); ret == nvml.SUCCESS {
			g.UtilGPU, g.UtilMem = int(u.Gpu), int(u.Memory)
		}
		if c, ret := d.GetClockInfo(nvml.CLOCK_SM); ret == nvml.SUCCESS {
			g.SMClockMHz = int(c)
		}
		if c, ret := d.GetMaxClockInfo(nvml.CLOCK_SM); ret == nvml.SUCCESS {
			g.MaxSMClockMHz = int(c)
		}
		if c, ret := d.GetClockInfo(nvml.CLOCK_MEM); ret == nvml.SUCCESS {
			g.MemClockMHz = int(c)
		}
		if p, ret := d.GetPowerUsage(); ret == nvml.SUCCESS {
			g.PowerW = float64(p) / 1000
		}
		if t, ret := d.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
			g.TemperatureC = int(t)
		}
		if p, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
			g.PCIBusID = pciString(p.BusIdLegacy[:])
		}
		for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
			st, ret := d.GetNvLinkState(l)
			if ret != nvml.SUCCESS {
				break
			}
			if st == nvml.FEATURE_ENABLED {
				g.NVLinks++
			}
		}
		g.PeakBF16FLOPS, g.PeakFloat32FLP, _ = Peak(g.Major, g.Minor, g.SMs(), g.MaxSMClockMHz)
		r.GPUs = append(r.GPUs, g)
	}
	return r, nil
}

func pciString(b []int8) string {
	var s strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		s.WriteByte(byte(c))
	}
	return s.String()
}
