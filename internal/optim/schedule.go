package optim

import (
	"fmt"
	"math"
)

// Schedule is torchtitan's warmup-stable-decay learning-rate schedule: a
// linear warmup, a constant stretch, then a decay (linear, sqrt or cosine)
// down to MinLRFactor × the peak rate.
type Schedule struct {
	PeakLR      float64
	Warmup      int     // warmup steps
	Total       int     // total training steps
	DecayRatio  float64 // fraction of Total spent decaying; < 0 means decay right after warmup
	DecayType   string  // "linear", "sqrt" or "cosine"
	MinLRFactor float64
}

// Validate checks the schedule's settings.
func (s Schedule) Validate() error {
	switch {
	case s.Total <= 0:
		return fmt.Errorf("lr schedule: total steps must be positive, got %d", s.Total)
	case s.Warmup < 0:
		return fmt.Errorf("lr schedule: warmup_steps must be >= 0, got %d", s.Warmup)
	case s.DecayRatio > 1:
		return fmt.Errorf("lr schedule: decay_ratio must be <= 1, got %g", s.DecayRatio)
	case s.MinLRFactor < 0 || s.MinLRFactor > 1:
		return fmt.Errorf("lr schedule: min_lr_factor must be in [0, 1], got %g", s.MinLRFactor)
	}
	switch s.DecayType {
	case "linear", "sqrt", "cosine":
	default:
		return fmt.Errorf("lr schedule: decay_type %q is not one of linear, sqrt, cosine", s.DecayType)
	}
	return nil
}

// LR is the learning rate of 0-based step.
func (s Schedule) LR(step int) float64 {
	warmup := min(s.Warmup, s.Total)
	decay := s.Total - warmup
	if s.DecayRatio >= 0 {
		decay = min(int(math.Round(float64(s.Total)*s.DecayRatio)), s.Total-warmup)
	}
	// One virtual step more than the run so the rate is not 0 on the last step.
	stable := s.Total + 1 - warmup - decay
	var f float64
	switch {
	case step < warmup:
		f = float64(step+1) / float64(warmup)
	case step < warmup+stable:
		f = 1
	default:
		p := float64(step+1-warmup-stable) / float64(decay)
		switch s.DecayType {
		case "sqrt":
			f = 1 - math.Sqrt(p)
		case "cosine":
			f = 0.5 * (1 + math.Cos(math.Pi*p))
		default:
			f = 1 - p
		}
		f = s.MinLRFactor + (1-s.MinLRFactor)*f
	}
	return s.PeakLR * f
}
