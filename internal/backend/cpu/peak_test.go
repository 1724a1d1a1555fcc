package cpu

import (
	"sync"
	"testing"
)

// resetHostPeak forgets the cached host peak.
func resetHostPeak() {
	host.once = sync.Once{}
	host.flops = 0
}

// TestHostPeakFLOPS: the launcher's value is used as it is and cached;
// without it (or with a bad one) the host is measured, positive, and
// measured once.
func TestHostPeakFLOPS(t *testing.T) {
	t.Cleanup(resetHostPeak)
	for _, tc := range []struct {
		name, env string
		want      float64 // 0: measured
	}{
		{"launcher value", "1.25e+11", 1.25e11},
		{"integer value", "987654321", 987654321},
		{"unset", "", 0},
		{"garbage", "fast", 0},
		{"negative", "-5", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resetHostPeak()
			t.Setenv(EnvHostPeakFLOPS, tc.env)
			got := HostPeakFLOPS()
			if tc.want != 0 && got != tc.want {
				t.Errorf("HostPeakFLOPS() = %g with %s=%q, want %g", got, EnvHostPeakFLOPS, tc.env, tc.want)
			}
			if got <= 0 {
				t.Errorf("HostPeakFLOPS() = %g, want a positive rate", got)
			}
			t.Setenv(EnvHostPeakFLOPS, "3e9")
			if again := HostPeakFLOPS(); again != got {
				t.Errorf("second call = %g, want the cached %g", again, got)
			}
		})
	}
}

func TestHostPeakRoundTrip(t *testing.T) {
	for _, v := range []float64{1, 3.5e10, 123456789.125} {
		got, err := ParseHostPeak(FormatHostPeak(v))
		if err != nil || got != v {
			t.Errorf("ParseHostPeak(FormatHostPeak(%g)) = %g, %v", v, got, err)
		}
	}
	for _, bad := range []string{"", "x", "0", "-1", "NaN", "Inf"} {
		if _, err := ParseHostPeak(bad); err == nil {
			t.Errorf("ParseHostPeak(%q): no error", bad)
		}
	}
}
