package launch

import (
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/backend/cpu"
)

// TestHostPeakEnv: the launcher hands its workers one host peak, measured
// once, unless a valid one is already set.
func TestHostPeakEnv(t *testing.T) {
	const key = cpu.EnvHostPeakFLOPS
	for _, tc := range []struct {
		name     string
		base     []string
		want     string
		measured int
	}{
		{"measured", []string{"PATH=/bin"}, "5e+10", 1},
		{"kept", []string{"PATH=/bin", key + "=7e9"}, "7e9", 0},
		{"bad value replaced", []string{key + "=fast", "PATH=/bin"}, "5e+10", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			env := hostPeakEnv(tc.base, func() float64 { calls++; return 5e10 })
			if calls != tc.measured {
				t.Errorf("measured %d times, want %d", calls, tc.measured)
			}
			var got []string
			for _, kv := range env {
				if k, v, _ := strings.Cut(kv, "="); k == key {
					got = append(got, v)
				}
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("%s values %q, want exactly %q", key, got, tc.want)
			}
			// Every worker's environment, built from it, carries the value.
			w := workerEnv(env, Spec{NProcPerNode: 2, NNodes: 1}, 1, "127.0.0.1:1", "job", "secret", 1)
			if !containsKV(w, key+"="+tc.want) {
				t.Errorf("worker environment lacks %s=%s", key, tc.want)
			}
		})
	}
}

func containsKV(env []string, kv string) bool {
	for _, e := range env {
		if e == kv {
			return true
		}
	}
	return false
}

func TestWorkerHosts(t *testing.T) {
	for _, tc := range []struct{ world, local, want int }{{1, 1, 1}, {4, 4, 1}, {8, 4, 2}, {6, 4, 2}, {4, 0, 1}} {
		w := &Worker{WorldSize: tc.world, LocalWorldSize: tc.local}
		if got := w.Hosts(); got != tc.want {
			t.Errorf("world %d, local %d: Hosts() = %d, want %d", tc.world, tc.local, got, tc.want)
		}
	}
}
