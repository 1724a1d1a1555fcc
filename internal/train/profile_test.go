package train

import (
	"slices"
	"testing"
)

// TestProfilerSchedule: torchtitan's schedule — in every window of
// profile_freq steps the last profiler_active steps are recorded after
// profiler_warmup steps that are recorded and thrown away.
func TestProfilerSchedule(t *testing.T) {
	tests := []struct {
		freq, warmup, active int
		last                 int
		recorded, warm       []int
	}{
		{10, 3, 1, 10, []int{10}, []int{7, 8, 9}},
		{10, 3, 1, 20, []int{20}, []int{17, 18, 19}},
		{4, 1, 2, 4, []int{3, 4}, []int{2}},
		{4, 1, 2, 7, []int{7}, []int{6}}, // a window cut short by the end of training
		{3, 0, 3, 3, []int{1, 2, 3}, []int{}},
		{1, 0, 1, 5, []int{5}, []int{}},
	}
	for _, tc := range tests {
		p := &profiler{freq: tc.freq, warmup: tc.warmup, active: tc.active}
		a, w := p.steps(tc.last, phaseActive), p.steps(tc.last, phaseWarmup)
		if !slices.Equal(a, tc.recorded) || !slices.Equal(w, tc.warm) {
			t.Errorf("freq %d warmup %d active %d, window ending %d: active %v warmup %v, want %v %v", tc.freq, tc.warmup, tc.active, tc.last, a, w, tc.recorded, tc.warm)
		}
	}
}
