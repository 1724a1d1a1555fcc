package optim

import (
	"math"
	"testing"
)

func TestScheduleShapes(t *testing.T) {
	// Hand-computed values of the warmup-stable-decay formula.
	for _, tc := range []struct {
		name string
		s    Schedule
		step int
		want float64
	}{
		{"warmup first", Schedule{PeakLR: 1, Warmup: 4, Total: 10, DecayRatio: -1, DecayType: "linear"}, 0, 0.25},
		{"warmup last", Schedule{PeakLR: 1, Warmup: 4, Total: 10, DecayRatio: -1, DecayType: "linear"}, 3, 1},
		// decay = 6, stable = 1: step 4 is stable, then p = (step+1-5)/6.
		{"stable", Schedule{PeakLR: 2, Warmup: 4, Total: 10, DecayRatio: -1, DecayType: "linear"}, 4, 2},
		{"linear mid", Schedule{PeakLR: 1, Warmup: 4, Total: 10, DecayRatio: -1, DecayType: "linear"}, 7, 0.5},
		{"linear last", Schedule{PeakLR: 1, Warmup: 4, Total: 10, DecayRatio: -1, DecayType: "linear"}, 9, 1.0 / 6},
		{"cosine mid", Schedule{PeakLR: 1, Warmup: 4, Total: 10, DecayRatio: -1, DecayType: "cosine"}, 7, 0.5},
		{"sqrt quarter", Schedule{PeakLR: 1, Warmup: 0, Total: 4, DecayRatio: -1, DecayType: "sqrt"}, 1, 0.5},
		{"min factor", Schedule{PeakLR: 1, Warmup: 4, Total: 10, DecayRatio: -1, DecayType: "linear", MinLRFactor: 0.1}, 7, 0.55},
		// decay_ratio 0.2 of 10 = 2 decay steps, stable = 10+1-4-2 = 5 → steps 4..8 stable.
		{"decay ratio stable", Schedule{PeakLR: 1, Warmup: 4, Total: 10, DecayRatio: 0.2, DecayType: "linear"}, 8, 1},
		{"decay ratio end", Schedule{PeakLR: 1, Warmup: 4, Total: 10, DecayRatio: 0.2, DecayType: "linear"}, 9, 0.5},
	} {
		if err := tc.s.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := tc.s.LR(tc.step); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: LR(%d) = %v, want %v", tc.name, tc.step, got, tc.want)
		}
	}
}

func TestScheduleValidate(t *testing.T) {
	for _, s := range []Schedule{
		{PeakLR: 1, Total: 0, DecayType: "linear"},
		{PeakLR: 1, Total: 5, Warmup: -1, DecayType: "linear"},
		{PeakLR: 1, Total: 5, DecayType: "exp"},
		{PeakLR: 1, Total: 5, DecayType: "linear", MinLRFactor: 2},
	} {
		if s.Validate() == nil {
			t.Errorf("%+v: want an error", s)
		}
	}
}

func TestClipScale(t *testing.T) {
	norm, scale := ClipScale(16, 1)
	if norm != 4 || math.Abs(float64(scale)-1/(4+1e-6)) > 1e-7 {
		t.Fatalf("ClipScale(16, 1) = %v, %v", norm, scale)
	}
	if _, scale := ClipScale(0.25, 1); scale != 1 {
		t.Fatalf("norm within max_norm must not scale, got %v", scale)
	}
}
