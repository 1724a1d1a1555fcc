package pipeline

import (
	"fmt"
	"strings"
)

// Theoretical returns the bubble fraction (idle time over makespan ×
// ranks) that the literature gives for the named schedule when every
// Forward, BackwardInput and BackwardWeight of a stage costs the same and
// transfers are free, together with the formula used:
//
//   - GPipe, 1F1B: (pp-1)/(m+pp-1) (Huang et al. 2019; Narayanan et al.
//     2021). It holds for any forward and backward costs.
//   - Interleaved1F1B, LoopedBFS: (pp-1)/(v·m+pp-1), the bubble time
//     (pp-1)/v·(tf+tb) of Narayanan et al. 2021 over an ideal time
//     m·(tf+tb), as a fraction of the makespan; it holds for any
//     forward and backward costs when m is a multiple of pp.
//   - InterleavedZeroBubble: (pp-1)/(3v·m+pp-1), from the ZB-H1 bubble
//     (pp-1)(F+B-W) of Qi et al. 2024 with F = B = W per stage, v·m
//     microbatch-stages of 3 units each per rank.
//   - ZBVZeroBubble: (pp-1)/(6m+pp-1). The steady state of ZB-V has no
//     bubble for m >= 2pp; with a synchronous step boundary the last
//     rank still waits pp-1 stage forwards for the first activation, and
//     symmetrically rank 0 for the last input gradient, which the
//     formula counts on every rank.
func Theoretical(name string, pp, virtual, microbatches int) (float64, string, error) {
	canon, err := Canonical(name)
	if err != nil {
		return 0, "", err
	}
	p, v, m := float64(pp), float64(virtual), float64(microbatches)
	switch canon {
	case "GPipe", "1F1B":
		return (p - 1) / (m + p - 1), "(pp-1)/(m+pp-1)", nil
	case "Interleaved1F1B", "LoopedBFS":
		return (p - 1) / (v*m + p - 1), "(pp-1)/(v·m+pp-1)", nil
	case "InterleavedZeroBubble":
		return (p - 1) / (3*v*m + p - 1), "(pp-1)/(3v·m+pp-1)", nil
	default: // ZBVZeroBubble
		return (p - 1) / (6*m + p - 1), "(pp-1)/(6m+pp-1)", nil
	}
}

// Report builds each named schedule for pp ranks, v stages per rank (1
// for the schedules that need one, 2 for ZBVZeroBubble) and m
// microbatches, simulates it with unit costs for every Forward,
// BackwardInput and BackwardWeight (a full Backward costs 2) and no
// transfer latency, and returns a table of simulated against theoretical
// bubble fractions, makespans and peak activations per rank. Names that
// fail to build stop the report with their error.
func Report(names []string, pp, v, m int) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "pipeline schedules: pp=%d v=%d microbatches=%d; unit costs F=I=W=1 (B=2), no latency\n", pp, v, m)
	fmt.Fprintf(&b, "%-22s %2s %9s %9s %-20s %8s  %s\n", "schedule", "v", "simulated", "theory", "formula", "makespan", "peak activations/rank")
	for _, name := range names {
		canon, err := Canonical(name)
		if err != nil {
			return "", err
		}
		vv := v
		switch canon {
		case "GPipe", "1F1B":
			vv = 1
		case "ZBVZeroBubble":
			vv = 2
		}
		s, err := Build(canon, pp, vv, m, nil)
		if err != nil {
			return "", err
		}
		tl := s.Simulate(Uniform(pp*vv, Costs{1, 1, 1}), 0)
		if tl.Err != nil {
			return "", tl.Err
		}
		th, formula, err := Theoretical(canon, pp, vv, m)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%-22s %2d %9.4f %9.4f %-20s %8.4g  %v\n", canon, vv, tl.Bubble, th, formula, tl.Makespan, tl.PeakActivations)
	}
	return b.String(), nil
}
