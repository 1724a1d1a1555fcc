package devices

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestPeakFromArchitectureSMsAndClock(t *testing.T) {
	for _, tc := range []struct {
		name              string
		major, minor      int
		sms, mhz          int
		wantBF16, wantF32 float64 // TFLOPS
	}{
		// NVIDIA's published dense figures follow from SMs × clock × rate.
		{"A100 SXM", 8, 0, 108, 1410, 311.9, 19.5},
		{"H100 SXM at its 1830 MHz tensor clock", 9, 0, 132, 1830, 989.5, 61.8},
		{"H100 SXM at its 1980 MHz max clock", 9, 0, 132, 1980, 1070.6, 66.9},
		{"RTX 4090", 8, 9, 128, 2520, 165.2, 82.6},
	} {
		bf, f, err := Peak(tc.major, tc.minor, tc.sms, tc.mhz)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if math.Abs(bf/1e12-tc.wantBF16) > 0.1 || math.Abs(f/1e12-tc.wantF32) > 0.1 {
			t.Errorf("%s: %.1f bf16 / %.1f float32 TFLOPS, want %.1f / %.1f", tc.name, bf/1e12, f/1e12, tc.wantBF16, tc.wantF32)
		}
	}
	if _, _, err := Peak(6, 1, 30, 1500); err == nil {
		t.Error("an unknown architecture got a peak")
	}
	if _, _, err := Peak(9, 0, 0, 1500); err == nil {
		t.Error("a peak without the SM count")
	}
	if (GPU{Major: 9, Cores: 16896}).SMs() != 132 {
		t.Error("H100 SXM: 16896 cores should be 132 SMs")
	}
}

func TestResolve(t *testing.T) {
	none := func() (Report, error) { return Report{}, &NoGPUError{Reason: "libnvidia-ml.so.1 not found"} }
	one := func() (Report, error) { return Report{GPUs: []GPU{{Name: "H100"}}}, nil }
	for _, tc := range []struct {
		setting string
		detect  func() (Report, error)
		want    string
		err     string
	}{
		{"", none, CPU, ""},
		{"", one, CUDA, ""},
		{"cpu", one, CPU, ""},
		{"cuda", one, CUDA, ""},
		{"cuda", none, "", `training.device = "cuda": no GPU found (libnvidia-ml.so.1 not found)`},
		{"tpu", one, "", `training.device = "tpu": want "cpu" or "cuda"`},
	} {
		got, err := Resolve(tc.setting, tc.detect)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && err.Error() != tc.err) {
			t.Errorf("Resolve(%q) = %q, %v; want %q, %q", tc.setting, got, err, tc.want, tc.err)
		}
	}
}

func TestDetectHere(t *testing.T) {
	r, err := Detect()
	var buf bytes.Buffer
	Print(&buf, r, err)
	t.Logf("%s", buf.String())
	if err != nil {
		var ng *NoGPUError
		if !errors.As(err, &ng) || !strings.HasPrefix(buf.String(), "no GPU found (") {
			t.Fatalf("Detect error %v is not a no-GPU report", err)
		}
		return
	}
	if len(r.GPUs) == 0 || !strings.Contains(buf.String(), "GPU 0: ") {
		t.Fatalf("report without GPUs:\n%s", buf.String())
	}
}
