package straggler

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func TestDetector(t *testing.T) {
	tests := []struct {
		name  string
		steps [][]time.Duration
		want  map[int][]int // step index → ranks reported; none elsewhere
	}{
		{"three slow steps", [][]time.Duration{ms(10, 30, 10, 11), ms(10, 31, 10, 11), ms(10, 32, 11, 10), ms(10, 33, 10, 10)}, map[int][]int{2: {1}}},
		{"interrupted", [][]time.Duration{ms(10, 30, 10, 10), ms(10, 30, 10, 10), ms(10, 10, 10, 10), ms(10, 30, 10, 10), ms(10, 30, 10, 10)}, nil},
		{"under the factor", [][]time.Duration{ms(10, 14, 10, 10), ms(10, 14, 10, 10), ms(10, 14, 10, 10)}, nil},
		{"noise under MinExcess", [][]time.Duration{{100, 900, 100, 100}, {100, 900, 100, 100}, {100, 900, 100, 100}}, nil},
		{"again after recovery", [][]time.Duration{ms(10, 30, 10), ms(10, 30, 10), ms(10, 30, 10), ms(10, 10, 10), ms(10, 30, 10), ms(10, 30, 10), ms(10, 30, 10)}, map[int][]int{2: {1}, 6: {1}}},
		{"two stragglers", [][]time.Duration{ms(10, 30, 10, 10, 40), ms(10, 30, 10, 10, 40), ms(10, 30, 10, 10, 40)}, map[int][]int{2: {1, 4}}},
		{"malformed step ignored", [][]time.Duration{ms(10, 30, 10), ms(10, 30, 10), ms(10, 30), ms(10, 30, 10)}, map[int][]int{3: {1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := New(len(tc.steps[0]), []string{"h0", "h1", "h2", "h3", "h4"})
			for i, c := range tc.steps {
				var got []int
				for _, r := range d.Observe(i+1, c) {
					got = append(got, r.Rank)
				}
				if !slices.Equal(got, tc.want[i]) {
					t.Errorf("step %d: reported ranks %v, want %v", i+1, got, tc.want[i])
				}
			}
		})
	}
}

func TestTwoStragglersAndLine(t *testing.T) {
	d := New(5, []string{"a", "b", "c", "d", "e"})
	var reps []Report
	for i := 1; i <= 3; i++ {
		reps = d.Observe(i, ms(10, 30, 10, 10, 40))
	}
	if len(reps) != 2 || reps[0].Rank != 1 || reps[1].Rank != 4 {
		t.Fatalf("reports %v", reps)
	}
	line := reps[0].String()
	for _, want := range []string{"rank 1", "on b", "3.00x", "30ms", "10ms", "step 3", "3 steps"} {
		if !strings.Contains(line, want) {
			t.Errorf("line %q lacks %q", line, want)
		}
	}
	// Reported once per episode.
	if reps := d.Observe(4, ms(10, 30, 10, 10, 40)); len(reps) != 0 {
		t.Errorf("reported again: %v", reps)
	}
}

func TestSlowRankHook(t *testing.T) {
	t.Setenv(EnvSlowRank, "2:150")
	if d, err := Delay(2); err != nil || d != 150*time.Millisecond {
		t.Errorf("Delay(2) = %v, %v", d, err)
	}
	if d, _ := Delay(1); d != 0 {
		t.Errorf("Delay(1) = %v", d)
	}
	t.Setenv(EnvSlowRank, "x")
	if _, err := Delay(0); err == nil || !strings.Contains(err.Error(), EnvSlowRank) {
		t.Errorf("bad value: %v", err)
	}
}
