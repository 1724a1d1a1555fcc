package generate

import (
	"math"
	"testing"
)

func TestGreedyAndTopK(t *testing.T) {
	logits := []float32{0.1, 3, 2.9, -1}
	s, _ := NewSampler(0, 0, 0, 1)
	if got := s.Sample(logits); got != 1 {
		t.Fatalf("greedy = %d, want 1", got)
	}
	s, _ = NewSampler(1, 2, 0, 1)
	for i := 0; i < 200; i++ {
		if got := s.Sample(logits); got != 1 && got != 2 {
			t.Fatalf("top-2 sampled %d", got)
		}
	}
}

func TestSamplingFrequencies(t *testing.T) {
	// Temperature 1, no cut: frequencies follow softmax within sampling noise.
	logits := []float32{0, float32(math.Log(2)), float32(math.Log(3))}
	s, _ := NewSampler(1, 0, 0, 42)
	counts := make([]int, 3)
	const n = 60000
	for i := 0; i < n; i++ {
		counts[s.Sample(logits)]++
	}
	for i, want := range []float64{1.0 / 6, 2.0 / 6, 3.0 / 6} {
		if got := float64(counts[i]) / n; math.Abs(got-want) > 0.01 {
			t.Errorf("token %d frequency %.3f, want %.3f", i, got, want)
		}
	}
	// top-p 0.5 keeps only the most likely token (p = 0.5).
	s, _ = NewSampler(1, 0, 0.5, 42)
	for i := 0; i < 100; i++ {
		if got := s.Sample(logits); got != 2 {
			t.Fatalf("top-p 0.5 sampled %d", got)
		}
	}
}

func TestSamplerRejectsBadSettings(t *testing.T) {
	for _, c := range []struct {
		temp float64
		k    int
		p    float64
	}{{-1, 0, 0}, {1, -1, 0}, {1, 0, 1.5}} {
		if _, err := NewSampler(c.temp, c.k, c.p, 0); err == nil {
			t.Errorf("%+v: want an error", c)
		}
	}
}
