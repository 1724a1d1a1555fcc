package cpu

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRememberPeak: the cache keeps the largest peak seen, and a
// corrupt file is replaced.
func TestRememberPeak(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "host-peak")
	for _, c := range []struct {
		measured, want float64
	}{
		{100e9, 100e9}, // first measurement: stored
		{80e9, 100e9},  // lower (a busy machine): the stored one
		{120e9, 120e9}, // higher: stored
		{90e9, 120e9},
	} {
		if got := rememberPeak(path, c.measured); got != c.want {
			t.Errorf("rememberPeak(%g) = %g, want %g", c.measured, got, c.want)
		}
	}
	if err := os.WriteFile(path, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := rememberPeak(path, 70e9); got != 70e9 {
		t.Errorf("after a corrupt cache: %g, want 70e9", got)
	}
	if got := rememberPeak(path, 60e9); got != 70e9 {
		t.Errorf("the corrupt cache was not replaced: %g, want 70e9", got)
	}
}
