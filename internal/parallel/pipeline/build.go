package pipeline

import (
	"fmt"
	"math"
	"strings"
)

// Names lists the schedules Build knows, spelled as torchtitan's
// parallelism.pipeline_parallel_schedule spells them.
var Names = []string{"GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble"}

// aliases maps extra lower-case spellings to names in Names.
var aliases = map[string]string{"zbv": "ZBVZeroBubble", "zbh1": "InterleavedZeroBubble"}

// Canonical returns the spelling in Names of a schedule name matched
// without regard to case (aliases "ZBV" and "ZBH1" included), or an
// error listing the valid names.
func Canonical(name string) (string, error) {
	low := strings.ToLower(name)
	for _, n := range Names {
		if strings.ToLower(n) == low {
			return n, nil
		}
	}
	if n, ok := aliases[low]; ok {
		return n, nil
	}
	if low == "dualpipev" {
		return "", fmt.Errorf("pipeline: schedule %q is not implemented; valid schedules are %s", name, strings.Join(Names, ", "))
	}
	return "", fmt.Errorf("pipeline: unknown schedule %q; valid schedules are %s (any case)", name, strings.Join(Names, ", "))
}

// Build returns the named schedule for pp ranks, virtual stages per rank
// and the given number of microbatches. Names match without regard to
// case. The rules are:
//
//   - GPipe: virtual = 1; all forwards, then all backwards.
//   - 1F1B: virtual = 1, microbatches >= pp; pp-r-1 warm-up forwards on
//     rank r, then alternating forward and backward (Narayanan et al.
//     2021, PipeDream-Flush).
//   - Interleaved1F1B: virtual >= 2, microbatches a multiple of pp; the
//     interleaved schedule of Narayanan et al. 2021 (Megatron-LM) with
//     loop placement (stage s on rank s mod pp).
//   - LoopedBFS: any virtual, any microbatches; loop placement, each rank
//     runs all microbatches through one stage before the next
//     (Lamy-Poirier 2023).
//   - InterleavedZeroBubble (alias ZBH1): any virtual, microbatches >= pp;
//     loop placement, backward split into BackwardInput and
//     BackwardWeight, ordered greedily in the manner of ZB-H1 (Qi et al.
//     2024): input gradients first, then forwards while the rank has no
//     more forwards awaiting their input gradient than Interleaved1F1B
//     (1F1B when virtual = 1) would and holds at most pp/2 activations
//     more than that schedule's first rank until the weight gradient,
//     then weight gradients to fill the gaps. (The slack lets weight
//     gradients wait for the drain; with less, this greedy rule leaves
//     bubbles ZB-H1 does not have. ZB-H1 proper keeps 1F1B's peak.)
//   - ZBVZeroBubble (alias ZBV): virtual = 2, microbatches >= pp; V
//     placement (rank r holds stages r and 2pp-1-r), split backward,
//     ordered by the same greedy rule with at most 2pp stage activations
//     (half-size stages, so the memory of 1F1B's first rank) per rank.
//
// The greedy rule runs on the costs given, one per stage (nil: equal
// costs), as the zero-bubble paper's scheduler does on profiled times;
// it also orders for the stages' mean and for equal passes, and keeps
// whichever order the stages' costs run fastest (bestGreedyZB).
func Build(name string, pp, virtual, microbatches int, costs []Costs) (Schedule, error) {
	canon, err := Canonical(name)
	if err != nil {
		return Schedule{}, err
	}
	if pp < 1 || virtual < 1 || microbatches < 1 {
		return Schedule{}, fmt.Errorf("pipeline: %s: pp=%d, virtual=%d, microbatches=%d must all be >= 1", canon, pp, virtual, microbatches)
	}
	if costs != nil && len(costs) != pp*virtual {
		return Schedule{}, fmt.Errorf("pipeline: %s: %d stage costs for %d stages", canon, len(costs), pp*virtual)
	}
	if err := checkCosts(costs); err != nil {
		return Schedule{}, fmt.Errorf("pipeline: %s: %w", canon, err)
	}
	if costs == nil {
		costs = Uniform(pp*virtual, Costs{1, 1, 1})
	}
	needVirtual := func(want int) error {
		if virtual != want {
			return fmt.Errorf("pipeline: %s needs virtual=%d stages per rank, got %d", canon, want, virtual)
		}
		return nil
	}
	needMB := func() error {
		if microbatches < pp {
			return fmt.Errorf("pipeline: %s needs microbatches >= pp=%d, got %d", canon, pp, microbatches)
		}
		return nil
	}
	var s Schedule
	switch canon {
	case "GPipe":
		if err := needVirtual(1); err != nil {
			return Schedule{}, err
		}
		s = gpipe(pp, microbatches)
	case "1F1B":
		if err := needVirtual(1); err != nil {
			return Schedule{}, err
		}
		if err := needMB(); err != nil {
			return Schedule{}, err
		}
		s = interleaved(pp, 1, microbatches)
	case "Interleaved1F1B":
		if virtual < 2 {
			return Schedule{}, fmt.Errorf("pipeline: Interleaved1F1B needs virtual >= 2 stages per rank, got %d (use 1F1B for one)", virtual)
		}
		if microbatches%pp != 0 {
			return Schedule{}, fmt.Errorf("pipeline: Interleaved1F1B needs microbatches to be a multiple of pp=%d, got %d", pp, microbatches)
		}
		s = interleaved(pp, virtual, microbatches)
	case "LoopedBFS":
		s = loopedBFS(pp, virtual, microbatches)
	case "InterleavedZeroBubble":
		if err := needMB(); err != nil {
			return Schedule{}, err
		}
		limitI := func(r int) int { return interleavedWarmup(pp, virtual, microbatches, r) + 1 }
		limitW := func(int) int { return limitI(0) + pp/2 }
		s, err = bestGreedyZB(pp, virtual, microbatches, LoopPlacement(pp, virtual), limitI, limitW, costs)
	case "ZBVZeroBubble":
		if err := needVirtual(2); err != nil {
			return Schedule{}, err
		}
		if err := needMB(); err != nil {
			return Schedule{}, err
		}
		s, err = bestGreedyZB(pp, 2, microbatches, VPlacement(pp), func(int) int { return 2 * pp }, func(int) int { return 2 * pp }, costs)
	}
	if err != nil {
		return Schedule{}, fmt.Errorf("pipeline: %s pp=%d virtual=%d microbatches=%d: %w", canon, pp, virtual, microbatches, err)
	}
	s.Name = canon
	if canon == "InterleavedZeroBubble" || canon == "ZBVZeroBubble" {
		s.Costs = costs
	}
	return s, nil
}

func newSchedule(pp, virtual, m int, place []int) Schedule {
	return Schedule{PP: pp, Virtual: virtual, Microbatches: m, StageRank: place, Actions: make([][]Action, pp)}
}

// gpipe: every rank runs all forwards, then all backwards.
func gpipe(pp, m int) Schedule {
	s := newSchedule(pp, 1, m, LoopPlacement(pp, 1))
	for r := range pp {
		for i := range m {
			s.Actions[r] = append(s.Actions[r], Action{Forward, r, i})
		}
		for i := range m {
			s.Actions[r] = append(s.Actions[r], Action{Backward, r, i})
		}
	}
	return s
}

// loopedBFS: each rank runs every microbatch through its stages in
// increasing order, then every backward in decreasing stage order.
func loopedBFS(pp, v, m int) Schedule {
	s := newSchedule(pp, v, m, LoopPlacement(pp, v))
	for r := range pp {
		for c := range v {
			for i := range m {
				s.Actions[r] = append(s.Actions[r], Action{Forward, c*pp + r, i})
			}
		}
		for c := v - 1; c >= 0; c-- {
			for i := range m {
				s.Actions[r] = append(s.Actions[r], Action{Backward, c*pp + r, i})
			}
		}
	}
	return s
}

// interleavedWarmup is the number of forwards rank r runs before its
// first backward in the (interleaved) 1F1B schedule: pp-r-1 for one
// stage per rank, 2(pp-r-1) + (v-1)pp for v > 1 (Megatron-LM), capped at
// the rank's v·m forwards.
func interleavedWarmup(pp, v, m, r int) int {
	w := pp - r - 1
	if v > 1 {
		w = 2*(pp-r-1) + (v-1)*pp
	}
	return min(w, v*m)
}

// interleaved builds 1F1B (v = 1) and the interleaved 1F1B of Megatron-LM
// (v > 1, m a multiple of pp). Rank r's k-th forward runs local chunk
// (k/pp) mod v on microbatch (k/(pp·v))·pp + k mod pp; its k-th backward
// runs the chunks in reverse order.
func interleaved(pp, v, m int) Schedule {
	s := newSchedule(pp, v, m, LoopPlacement(pp, v))
	total := v * m
	group := pp
	if v == 1 {
		group = m // one chunk: microbatches in plain order
	}
	at := func(r, k int, backward bool) Action {
		c := (k / group) % v
		if backward {
			c = v - 1 - c
		}
		i := (k/(group*v))*group + k%group
		kind := Forward
		if backward {
			kind = Backward
		}
		return Action{kind, c*pp + r, i}
	}
	for r := range pp {
		w := interleavedWarmup(pp, v, m, r)
		list := make([]Action, 0, 2*total)
		for k := range w {
			list = append(list, at(r, k, false))
		}
		for k := range total - w {
			list = append(list, at(r, w+k, false), at(r, k, true))
		}
		for k := total - w; k < total; k++ {
			list = append(list, at(r, k, true))
		}
		s.Actions[r] = list
	}
	return s
}

// Costs are the relative durations of a stage's Forward, BackwardInput
// and BackwardWeight on one microbatch, for which Build orders the
// zero-bubble schedules and Simulate times a schedule. (The other
// schedules' orders do not depend on costs.) A recomputing stage's
// BackwardInput also reruns its forward, so it costs more than the
// others, and an order made for equal costs leaves bubbles that do not
// shrink with more microbatches; a stage with the head costs more than
// one without.
type Costs struct {
	Forward, Input, Weight float64
}

// Uniform returns n copies of c: the costs of n equal stages.
func Uniform(n int, c Costs) []Costs {
	out := make([]Costs, n)
	for i := range out {
		out[i] = c
	}
	return out
}

// checkCosts refuses a negative, NaN or infinite cost.
func checkCosts(costs []Costs) error {
	for st, c := range costs {
		for _, x := range []float64{c.Forward, c.Input, c.Weight} {
			if !(x >= 0) || math.IsInf(x, 1) {
				return fmt.Errorf("stage %d costs %+v must be finite and non-negative", st, c)
			}
		}
	}
	return nil
}

func (c Costs) of(k Kind) float64 {
	switch k {
	case Forward:
		return c.Forward
	case BackwardInput:
		return c.Input
	case BackwardWeight:
		return c.Weight
	}
	return c.Input + c.Weight
}

// bestGreedyZB orders a split-backward schedule with greedyZB for the
// stages' costs, for their mean (every stage alike) and for equal passes,
// and returns the order whose simulation under the stages' costs ends
// first (the earlier on ties). The greedy rule is a heuristic: an order
// made for the true costs is not always the best under them (ZBV on a
// head-heavy last stage can do worse than the order made for the mean).
func bestGreedyZB(pp, v, m int, place []int, limitI, limitW func(int) int, costs []Costs) (Schedule, error) {
	var mean Costs
	for _, c := range costs {
		mean.Forward += c.Forward / float64(len(costs))
		mean.Input += c.Input / float64(len(costs))
		mean.Weight += c.Weight / float64(len(costs))
	}
	var best Schedule
	bestEnd := math.Inf(1)
	for _, cand := range [][]Costs{costs, Uniform(len(costs), mean), Uniform(len(costs), Costs{1, 1, 1})} {
		s, err := greedyZB(pp, v, m, place, limitI, limitW, cand)
		if err != nil {
			return Schedule{}, err
		}
		tl := s.Simulate(costs, 0)
		if tl.Err != nil {
			return Schedule{}, tl.Err
		}
		if tl.Makespan < bestEnd {
			best, bestEnd = s, tl.Makespan
		}
	}
	return best, nil
}

// greedyZB orders a split-backward schedule by list scheduling with the
// given costs (one per stage) and no latency: whenever a rank is free it runs, in order
// of preference, a ready BackwardInput (oldest microbatch first, later
// stage on ties), a ready Forward (later stage first, each stage's
// microbatches in order) if fewer than limitW(r) of the rank's forwards
// await their BackwardWeight and, for the rank's first stage only, fewer
// than limitI(r) await their BackwardInput, or a ready BackwardWeight
// (oldest first). Exempting later stages from limitI keeps a rank from
// filling its quota with first-stage forwards whose later stages it then
// cannot run. Should the limits ever stall every rank, the first rank
// with a ready Forward runs it regardless.
func greedyZB(pp, v, m int, place []int, limitI, limitW func(int) int, costs []Costs) (Schedule, error) {
	s := newSchedule(pp, v, m, place)
	S := pp * v
	never := math.Inf(1)
	var end [numKinds][]float64 // end time of each (kind, stage, mb), or never
	for k := range end {
		end[k] = make([]float64, S*m)
		for x := range end[k] {
			end[k][x] = never
		}
	}
	ready := func(k Kind, st, i int, t float64) bool {
		return end[k][st*m+i] <= t
	}
	stages := make([][]int, pp)
	for r := range pp {
		stages[r] = s.Stages(r)
	}
	held := make([]int, pp)    // F done, W not
	pending := make([]int, pp) // F done, I not
	busy := make([]float64, pp)
	// Each stage's first microbatch not yet ordered, per kind: the scans
	// below start there (everything before it is ordered already).
	var first [numKinds][]int
	for k := range first {
		first[k] = make([]int, S)
	}
	lowest := func(k Kind, r int) int {
		lo := m
		for _, st := range stages[r] {
			lo = min(lo, first[k][st])
		}
		return lo
	}
	left := 3 * S * m
	relax := false // ignore the forward limits for one pass
	t := 0.0
	for events := 0; left > 0; events++ {
		// Each pass runs an action, moves to the next completion or
		// relaxes the limits for the next pass: at most three per action.
		if events > 9*S*m+S {
			return Schedule{}, fmt.Errorf("greedy ordering made no progress by time %g", t)
		}
		ran, running := false, false
		for r := range pp {
			if busy[r] > t {
				running = true
				continue
			}
			best, found := Action{}, false
			// Input gradients.
			for i := lowest(BackwardInput, r); i < m && !found; i++ {
				for j := len(stages[r]) - 1; j >= 0; j-- {
					st := stages[r][j]
					if end[BackwardInput][st*m+i] == never && ready(Forward, st, i, t) && (st == S-1 || ready(BackwardInput, st+1, i, t)) {
						best, found = Action{BackwardInput, st, i}, true
						break
					}
				}
			}
			// Forwards.
			if !found {
				roomW := relax || held[r] < limitW(r)
				roomI := relax || pending[r] < limitI(r)
				for j := len(stages[r]) - 1; j >= 0 && !found; j-- {
					st := stages[r][j]
					if !roomW || j == 0 && !roomI {
						break
					}
					// Forwards of a stage run in microbatch order.
					if i := first[Forward][st]; i < m && (st == 0 || ready(Forward, st-1, i, t)) {
						best, found = Action{Forward, st, i}, true
					}
				}
			}
			// Weight gradients.
			for i := lowest(BackwardWeight, r); i < m && !found; i++ {
				for _, st := range stages[r] {
					if end[BackwardWeight][st*m+i] == never && ready(BackwardInput, st, i, t) {
						best, found = Action{BackwardWeight, st, i}, true
						break
					}
				}
			}
			if !found {
				continue
			}
			switch best.Kind {
			case Forward:
				held[r]++
				pending[r]++
			case BackwardInput:
				pending[r]--
			case BackwardWeight:
				held[r]--
			}
			done := t + costs[best.Stage].of(best.Kind)
			end[best.Kind][best.Stage*m+best.Microbatch] = done
			for f := &first[best.Kind][best.Stage]; *f < m && end[best.Kind][best.Stage*m+*f] != never; {
				*f++
			}
			busy[r] = done
			s.Actions[r] = append(s.Actions[r], best)
			left--
			ran = true
			if relax {
				relax = false
				break
			}
		}
		if !ran && !running && left > 0 {
			// Every rank is idle and stays so: the limits starve
			// the forwards the pending backwards wait for. Let the
			// first rank with a ready forward exceed its limit once.
			relax = true
			continue
		}
		// The next time a rank comes free (readiness changes only then).
		next := never
		for _, b := range busy {
			if b > t && b < next {
				next = b
			}
		}
		if next < never {
			t = next
		}
	}
	return s, nil
}
