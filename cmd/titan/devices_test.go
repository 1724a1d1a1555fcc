package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/devices"
)

// TestDevicesWithoutGPU: on a machine without a GPU `titan devices` says
// so and succeeds, and training.device = "cuda" is refused, naming the
// key, before the run allocates anything (no dump folder appears).
func TestDevicesWithoutGPU(t *testing.T) {
	if _, err := devices.Detect(); err == nil {
		t.Skip("this machine has a GPU")
	}
	out, err := titan(t, "devices")
	if err != nil || !strings.HasPrefix(out, "no GPU found (") {
		t.Fatalf("titan devices = %q, %v; want \"no GPU found (…)\" and success", out, err)
	}
	dump := filepath.Join(t.TempDir(), "dump")
	args := append(tinyRun(dump, corpus(t), 2), "--set", "training.device=cuda")
	out, err = titan(t, args...)
	if err == nil || !strings.Contains(err.Error(), `training.device = "cuda": no GPU found (`) {
		t.Fatalf("training.device=cuda without a GPU: %v\n%s", err, out)
	}
	if m, _ := filepath.Glob(filepath.Join(dump, "checkpoint*", "*")); len(m) > 0 {
		t.Errorf("a refused run wrote %v", m)
	}
	// The default picks the CPU here.
	args = append(tinyRun(filepath.Join(t.TempDir(), "dump"), corpus(t), 1), "--set", "training.device=", "--set", "checkpoint.enable=false")
	if out, err := titan(t, args...); err != nil {
		t.Fatalf("training.device unset: %v\n%s", err, out)
	}
}
