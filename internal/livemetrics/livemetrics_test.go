package livemetrics

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSnapshotRoundTripAndPrometheus(t *testing.T) {
	path := filepath.Join(t.TempDir(), "live.json")
	if _, ok, err := Read(path); ok || err != nil {
		t.Fatalf("no snapshot yet: ok %v, err %v", ok, err)
	}
	s := Snapshot{Time: time.Unix(100, 0), Step: 7, Steps: 10, Loss: 1.0 / 3, StepsPerSec: 2, TokensPerSec: 128, MFU: 1.5, Stragglers: 1,
		Ranks: []Rank{{Rank: 0, Host: `a"b`, StepS: 0.5, ComputeS: 0.25, MemGiB: 1}, {Rank: 1, Host: "h", StepS: 0.5, ComputeS: 0.4, MemGiB: 0.5}}}
	if err := Write(path, s); err != nil {
		t.Fatal(err)
	}
	got, ok, err := Read(path)
	if err != nil || !ok || got.Loss != s.Loss || len(got.Ranks) != 2 || got.Ranks[0].Host != `a"b` {
		t.Fatalf("read back %+v, %v, %v", got, ok, err)
	}
	var b strings.Builder
	if err := WritePrometheus(&b, "j1", got, true); err != nil {
		t.Fatal(err)
	}
	text := b.String()
	for _, want := range []string{
		"# TYPE titan_step gauge\ntitan_step{job_id=\"j1\"} 7\n",
		"titan_loss{job_id=\"j1\"} 0.3333333333333333\n", // exact: shortest round-trip digits
		"# TYPE titan_stragglers_reported counter\n",
		`titan_rank_memory_bytes{job_id="j1",rank="0",host="a\"b"} 1.073741824e+09`,
		`titan_rank_compute_seconds{job_id="j1",rank="1",host="h"} 0.4`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("exposition lacks %q:\n%s", want, text)
		}
	}
	b.Reset()
	WritePrometheus(&b, "j1", Snapshot{}, false)
	if b.String() != "# HELP titan_job_up 1 while the job runs and rank 0 has reported a step.\n# TYPE titan_job_up gauge\ntitan_job_up{job_id=\"j1\"} 0\n" {
		t.Errorf("before the first step:\n%s", b.String())
	}
}

func TestCheckLoopback(t *testing.T) {
	tests := []struct {
		addr   string
		public bool
		ok     bool
	}{
		{"127.0.0.1:9400", false, true},
		{"[::1]:0", false, true},
		{"localhost:9400", false, true},
		{"0.0.0.0:9400", false, false},
		{":9400", false, false},
		{"10.0.0.1:9400", false, false},
		{"10.0.0.1:9400", true, true},
		{"nonsense", true, false},
	}
	for _, tc := range tests {
		err := CheckLoopback("--metrics-addr", tc.addr, tc.public)
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "--metrics-addr")) {
			t.Errorf("%s public %v: %v", tc.addr, tc.public, err)
		}
	}
}
