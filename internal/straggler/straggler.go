// Package straggler finds the rank that holds a synchronous job back: the
// one whose compute time per step (its step time minus the time it spent
// blocked in communication, comm.BlockedTime) exceeds the median over the
// ranks by Factor for Steps steps in a row.
//
// The defaults are fixed and documented rather than recipe keys:
// DefaultFactor 1.5 and DefaultSteps 3. A rank is reported once when it
// becomes a straggler, and again only after it recovered (a step under the
// threshold) and fell behind again.
//
// For tests, the environment variable TITAN_TEST_SLOW_RANK="<rank>:<ms>"
// makes that rank sleep ms milliseconds of every step inside its compute
// time (Delay); it is a test hook only and does nothing when unset.
package straggler

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults of the detector.
const (
	DefaultFactor = 1.5
	DefaultSteps  = 3
	// MinExcess is the least excess over the median that counts: below
	// it, differences are scheduling noise of steps of a few milliseconds.
	MinExcess = 2 * time.Millisecond
)

// Report names a straggler.
type Report struct {
	Rank int
	Host string
	// Step is the step of the latest observation; Steps how many
	// consecutive steps the rank has been behind.
	Step, Steps int
	// Compute is the rank's compute time of that step, Median the median
	// over the ranks.
	Compute, Median time.Duration
}

// Ratio is the rank's compute time over the median.
func (r Report) Ratio() float64 { return float64(r.Compute) / float64(max(r.Median, 1)) }

// String is the log line's text.
func (r Report) String() string {
	return fmt.Sprintf("straggler: rank %d on %s computed %.2fx the median step (%s vs %s at step %d, %d steps in a row)",
		r.Rank, r.Host, r.Ratio(), r.Compute.Round(time.Microsecond), r.Median.Round(time.Microsecond), r.Step, r.Steps)
}

// Detector follows the ranks' compute times step after step.
type Detector struct {
	Factor float64
	Steps  int
	hosts  []string
	behind []int // consecutive steps each rank has been behind
	sorted []time.Duration
}

// New returns a detector of world ranks with the defaults; hosts names
// each rank's machine (may be nil).
func New(world int, hosts []string) *Detector {
	return &Detector{Factor: DefaultFactor, Steps: DefaultSteps, hosts: hosts, behind: make([]int, world), sorted: make([]time.Duration, world)}
}

// Observe takes one step's compute time of every rank and returns the
// ranks that have just become stragglers.
func (d *Detector) Observe(step int, compute []time.Duration) []Report {
	if len(compute) != len(d.behind) || len(compute) < 2 {
		return nil
	}
	copy(d.sorted, compute)
	slices.Sort(d.sorted)
	n := len(d.sorted)
	med := d.sorted[n/2]
	if n%2 == 0 {
		med = (d.sorted[n/2-1] + d.sorted[n/2]) / 2
	}
	var out []Report
	for r, c := range compute {
		if float64(c) > d.Factor*float64(med) && c-med >= MinExcess {
			d.behind[r]++
		} else {
			d.behind[r] = 0
		}
		if d.behind[r] == d.Steps {
			host := "?"
			if r < len(d.hosts) && d.hosts[r] != "" {
				host = d.hosts[r]
			}
			out = append(out, Report{Rank: r, Host: host, Step: step, Steps: d.behind[r], Compute: c, Median: med})
		}
	}
	return out
}

// EnvSlowRank is the test hook's environment variable.
const EnvSlowRank = "TITAN_TEST_SLOW_RANK"

// SlowRank parses EnvSlowRank ("<rank>:<ms>"); ok is false when unset.
func SlowRank() (rank int, d time.Duration, ok bool, err error) {
	v := os.Getenv(EnvSlowRank)
	if v == "" {
		return 0, 0, false, nil
	}
	rs, ms, found := strings.Cut(v, ":")
	r, err1 := strconv.Atoi(rs)
	m, err2 := strconv.Atoi(ms)
	if !found || err1 != nil || err2 != nil || r < 0 || m < 0 {
		return 0, 0, false, fmt.Errorf("%s=%q: want <rank>:<milliseconds>", EnvSlowRank, v)
	}
	return r, time.Duration(m) * time.Millisecond, true, nil
}

// Delay returns the per-step sleep of rank under the test hook (0 when
// unset or another rank).
func Delay(rank int) (time.Duration, error) {
	r, d, ok, err := SlowRank()
	if err != nil || !ok || r != rank {
		return 0, err
	}
	return d, nil
}
