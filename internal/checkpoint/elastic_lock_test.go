package checkpoint

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLockOfEarlierElasticRound: a lock held by a live process of an
// earlier round of the same elastic job is taken over; one of the same
// round, or of another job, is refused.
func TestLockOfEarlierElasticRound(t *testing.T) {
	defer func(old struct {
		Job   string
		Round int
	}) {
		ElasticRound = old
	}(ElasticRound)
	for _, c := range []struct {
		name      string
		job       string
		round     int
		takenOver bool
	}{
		{"earlier round", "job-a", 1, true},
		{"same round", "job-a", 2, false},
		{"another job", "job-b", 1, false},
		{"not elastic", "", 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			// A live holder on another host: its pid cannot be checked.
			holder, _ := json.Marshal(Owner{Host: "elsewhere", PID: 1, Job: c.job, Round: c.round})
			if err := os.WriteFile(filepath.Join(dir, LockFile), holder, 0o644); err != nil {
				t.Fatal(err)
			}
			ElasticRound.Job, ElasticRound.Round = "job-a", 2
			l, err := Acquire(dir)
			if c.takenOver {
				if err != nil {
					t.Fatalf("Acquire: %v, want the lock of round %d taken over", err, c.round)
				}
				l.Release()
				return
			}
			if err == nil || !strings.Contains(err.Error(), "pid 1 on host elsewhere") {
				t.Fatalf("Acquire: %v, want refused naming the holder", err)
			}
		})
	}
}
