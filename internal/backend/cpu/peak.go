package cpu

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/titan-go/titan/internal/backend/cpu/gemm"
)

// peaks caches PeakFLOPS per thread count (threads → *peakResult).
var peaks sync.Map

type peakResult struct {
	once  sync.Once
	flops float64
}

// PeakFLOPS is the float32 throughput this backend's GEMM reaches on a
// cache-friendly 512×512×512 product with all its threads, measured once
// per thread count (about 50 ms). It is the reference for MFU on the CPU,
// where the theoretical peak depends on clock boosts a VM cannot see.
//
// MFU should use HostPeakFLOPS instead: the peak of one thread share
// depends on how the cores are split and on what else runs meanwhile.
func (b *Backend) PeakFLOPS() float64 {
	return b.measurePeak()
}

// measurePeak measures (once per thread count) the GEMM throughput of
// b's workers.
func (b *Backend) measurePeak() float64 {
	v, _ := peaks.LoadOrStore(b.pool.Size(), &peakResult{})
	r := v.(*peakResult)
	r.once.Do(func() {
		const n = 512
		a := make([]float32, n*n)
		for i := range a {
			a[i] = float32(i%7) * 0.25
		}
		c := make([]float32, n*n)
		best := time.Duration(1 << 62)
		deadline := time.Now().Add(50 * time.Millisecond)
		for i := 0; i < 3 || time.Now().Before(deadline); i++ {
			t0 := time.Now()
			gemm.Sgemm(b.pool, false, false, n, n, n, 1, a, n, a, n, 0, c, n)
			best = min(best, time.Since(t0))
			if i > 50 {
				break
			}
		}
		r.flops = 2 * n * n * n / best.Seconds()
	})
	return r.flops
}

// EnvHostPeakFLOPS is the environment variable through which a launcher
// hands the host's measured peak (FLOP/s, a decimal number) to its
// workers, so that every worker of a host uses the same peak. It is in the
// launcher's TITANRUN_ namespace because TITAN_<SECTION>_<KEY> names are
// recipe keys.
const EnvHostPeakFLOPS = "TITANRUN_HOST_PEAK_FLOPS"

var host struct {
	once  sync.Once
	flops float64
}

// HostPeakFLOPS is the float32 GEMM peak of this whole host, the
// reference for MFU whatever the layout: the value of EnvHostPeakFLOPS
// when it is set (by the launcher, which measures once before starting
// its workers) and valid, else the larger of PeakFLOPS measured now with
// runtime.NumCPU() threads and the largest peak measured on this host
// before (see peakCache). A measurement taken while other work runs is
// low, and a peak only errs low, so the largest one seen is the best
// estimate: it keeps MFU the same quantity from run to run. The result is
// cached for the process. MFU is then model FLOPs × tokens/s ÷
// (HostPeakFLOPS × number of hosts).
func HostPeakFLOPS() float64 {
	host.once.Do(func() {
		if v, err := ParseHostPeak(os.Getenv(EnvHostPeakFLOPS)); err == nil && v > 0 {
			host.flops = v
			return
		}
		host.flops = MeasureHostPeak()
		if path, err := peakCache(); err == nil {
			host.flops = rememberPeak(path, host.flops)
		}
	})
	return host.flops
}

// peakCache is the file holding the largest host peak measured so far:
// <user cache dir>/titan/host-peak-<cores>-<kernel>, one per core count
// and GEMM kernel.
func peakCache() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "titan", fmt.Sprintf("host-peak-%d-%s", runtime.NumCPU(), gemm.Kernel())), nil
}

// rememberPeak returns the larger of flops and the peak stored at path,
// storing flops when it is larger (write to a temporary file, then
// rename; errors leave the file as it was and are otherwise ignored: the
// cache only steadies MFU).
func rememberPeak(path string, flops float64) float64 {
	if b, err := os.ReadFile(path); err == nil {
		if old, err := ParseHostPeak(strings.TrimSpace(string(b))); err == nil && old >= flops {
			return old
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return flops
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".host-peak-*")
	if err != nil {
		return flops
	}
	_, werr := tmp.WriteString(FormatHostPeak(flops) + "\n")
	if cerr := tmp.Close(); werr != nil || cerr != nil || os.Rename(tmp.Name(), path) != nil {
		os.Remove(tmp.Name())
	}
	return flops
}

// MeasureHostPeak measures the GEMM peak with one thread per core, on a
// backend of its own that it closes afterwards (cached per thread count,
// as PeakFLOPS is).
func MeasureHostPeak() float64 {
	b := New(runtime.NumCPU())
	defer b.Close()
	return b.measurePeak()
}

// ParseHostPeak parses an EnvHostPeakFLOPS value; "" is an error too.
func ParseHostPeak(s string) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v <= 0 || v != v || v > 1e30 {
		return 0, fmt.Errorf("cpu: %s=%q is not a positive FLOP/s rate", EnvHostPeakFLOPS, s)
	}
	return v, nil
}

// FormatHostPeak writes a peak for EnvHostPeakFLOPS.
func FormatHostPeak(flops float64) string { return strconv.FormatFloat(flops, 'g', -1, 64) }
