// Package pipeline describes pipeline-parallel schedules as plain data:
// for each pipeline rank, the ordered list of forward and backward
// computations it runs on its model stages. It builds the schedules that
// torchtitan's parallelism.pipeline_parallel_schedule names, checks that a
// schedule respects the data dependencies between stages, simulates it
// under a simple cost model, and renders the result as a text Gantt chart.
//
// The schedules are data; the Executor runs one rank's list on its
// stages (any model's, through the Stage interface). Point-to-point
// transfers are implicit: whenever an action depends on an action of a
// stage placed on another rank, the executor sends the activation (for
// forwards) or the input gradient (for backwards) between the two ranks.
//
// # Model
//
// A model is cut into S = pp·v consecutive stages 0..S-1; rank r holds v
// of them (see Schedule.StageRank). Each of m microbatches flows forward
// through stages 0..S-1 and its gradient flows back through S-1..0. The
// dependencies are:
//
//   - Forward(s, i) needs Forward(s-1, i) for s > 0.
//   - Backward(s, i) and BackwardInput(s, i) need Forward(s, i) and, for
//     s < S-1, the input gradient of stage s+1: Backward(s+1, i) or
//     BackwardInput(s+1, i).
//   - BackwardWeight(s, i) needs BackwardInput(s, i).
//
// Backward computes both the input and the weight gradient; zero-bubble
// schedules split it into BackwardInput (the gradient the previous stage
// waits for) and BackwardWeight (the parameter gradient, which nothing
// waits for and which therefore fills pipeline bubbles).
package pipeline

import (
	"fmt"
	"strings"
)

// Kind is the kind of computation an Action performs.
type Kind uint8

const (
	// Forward runs the stage's forward pass on one microbatch.
	Forward Kind = iota
	// Backward runs the full backward pass (input and weight gradients).
	Backward
	// BackwardInput computes only the gradient with respect to the
	// stage's input, which the previous stage needs ("B" in the
	// zero-bubble paper).
	BackwardInput
	// BackwardWeight computes only the gradient with respect to the
	// stage's parameters ("W" in the zero-bubble paper).
	BackwardWeight
	numKinds
)

// String returns the one-letter name used in renderings: F, B, I or W.
func (k Kind) String() string {
	switch k {
	case Forward:
		return "F"
	case Backward:
		return "B"
	case BackwardInput:
		return "I"
	case BackwardWeight:
		return "W"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Action is one computation of one stage on one microbatch.
type Action struct {
	Kind       Kind
	Stage      int
	Microbatch int
}

// String renders the action as kind, stage and microbatch, e.g. "F1/3"
// for the forward of stage 1 on microbatch 3.
func (a Action) String() string {
	return fmt.Sprintf("%v%d/%d", a.Kind, a.Stage, a.Microbatch)
}

// Schedule is a pipeline-parallel schedule: the ordered list of actions
// each rank runs during one training step.
type Schedule struct {
	// Name is the schedule's name as Build spells it.
	Name string
	// PP is the number of pipeline ranks.
	PP int
	// Virtual is the number of stages each rank holds.
	Virtual int
	// Microbatches is the number of microbatches per step.
	Microbatches int
	// StageRank maps each of the PP·Virtual stages to the rank that
	// holds it.
	StageRank []int
	// Actions lists, for each rank, the actions it runs in order.
	Actions [][]Action
	// Costs are the costs of each stage a zero-bubble schedule was
	// ordered for (nil for the others, whose order does not depend on
	// costs).
	Costs []Costs
}

// NumStages returns the number of model stages, PP·Virtual.
func (s Schedule) NumStages() int { return len(s.StageRank) }

// Stages returns the stages rank holds, in increasing order.
func (s Schedule) Stages(rank int) []int {
	var out []int
	for st, r := range s.StageRank {
		if r == rank {
			out = append(out, st)
		}
	}
	return out
}

// LoopPlacement returns the stage-to-rank map of interleaved schedules:
// stage s lives on rank s mod pp.
func LoopPlacement(pp, virtual int) []int {
	p := make([]int, pp*virtual)
	for s := range p {
		p[s] = s % pp
	}
	return p
}

// VPlacement returns the stage-to-rank map of V-shaped schedules with two
// stages per rank: rank r holds stages r and 2pp-1-r, so the last rank
// holds the two middle stages and rank 0 the first and last.
func VPlacement(pp int) []int {
	p := make([]int, 2*pp)
	for r := range pp {
		p[r] = r
		p[2*pp-1-r] = r
	}
	return p
}

// key identifies a (stage, microbatch) pair.
type key struct{ stage, mb int }

// deps returns the actions a needs, given whether the input gradient of
// each (stage, microbatch) is produced by BackwardInput (split) or
// Backward.
func deps(a Action, numStages int, split func(stage, mb int) bool) []Action {
	gradOf := func(stage int) Action {
		if split(stage, a.Microbatch) {
			return Action{BackwardInput, stage, a.Microbatch}
		}
		return Action{Backward, stage, a.Microbatch}
	}
	switch a.Kind {
	case Forward:
		if a.Stage > 0 {
			return []Action{{Forward, a.Stage - 1, a.Microbatch}}
		}
	case Backward, BackwardInput:
		d := []Action{{Forward, a.Stage, a.Microbatch}}
		if a.Stage < numStages-1 {
			d = append(d, gradOf(a.Stage+1))
		}
		return d
	case BackwardWeight:
		return []Action{{BackwardInput, a.Stage, a.Microbatch}}
	}
	return nil
}

// Validate checks that s is well formed and can run to completion: every
// rank runs only its own stages; every (stage, microbatch) pair has
// exactly one Forward and either exactly one Backward or exactly one
// BackwardInput and one BackwardWeight; and executing the ranks' lists in
// order, each action waiting for its dependencies (see the package
// documentation), never deadlocks. Same-rank dependencies must therefore
// come earlier in that rank's list.
func (s Schedule) Validate() error {
	if s.PP < 1 || s.Virtual < 1 || s.Microbatches < 1 {
		return fmt.Errorf("pipeline: schedule %q: pp=%d, virtual=%d, microbatches=%d must all be >= 1", s.Name, s.PP, s.Virtual, s.Microbatches)
	}
	if len(s.Actions) != s.PP {
		return fmt.Errorf("pipeline: schedule %q has action lists for %d ranks, want pp=%d", s.Name, len(s.Actions), s.PP)
	}
	S, m := s.PP*s.Virtual, s.Microbatches
	if len(s.StageRank) != S {
		return fmt.Errorf("pipeline: schedule %q places %d stages, want pp·virtual=%d", s.Name, len(s.StageRank), S)
	}
	held := make([]int, s.PP)
	for st, r := range s.StageRank {
		if r < 0 || r >= s.PP {
			return fmt.Errorf("pipeline: schedule %q places stage %d on rank %d, outside [0, %d)", s.Name, st, r, s.PP)
		}
		held[r]++
	}
	for r, n := range held {
		if n != s.Virtual {
			return fmt.Errorf("pipeline: schedule %q places %d stages on rank %d, want virtual=%d", s.Name, n, r, s.Virtual)
		}
	}
	var count [numKinds][]int
	for k := range count {
		count[k] = make([]int, S*m)
	}
	for r, list := range s.Actions {
		for j, a := range list {
			if a.Kind >= numKinds || a.Stage < 0 || a.Stage >= S || a.Microbatch < 0 || a.Microbatch >= m {
				return fmt.Errorf("pipeline: schedule %q rank %d action %d (%v) is out of range (stages %d, microbatches %d)", s.Name, r, j, a, S, m)
			}
			if s.StageRank[a.Stage] != r {
				return fmt.Errorf("pipeline: schedule %q rank %d action %d (%v) runs stage %d, which lives on rank %d", s.Name, r, j, a, a.Stage, s.StageRank[a.Stage])
			}
			count[a.Kind][a.Stage*m+a.Microbatch]++
		}
	}
	for st := range S {
		for i := range m {
			x := st*m + i
			f, b, in, w := count[Forward][x], count[Backward][x], count[BackwardInput][x], count[BackwardWeight][x]
			ok := f == 1 && ((b == 1 && in == 0 && w == 0) || (b == 0 && in == 1 && w == 1))
			if !ok {
				return fmt.Errorf("pipeline: schedule %q stage %d microbatch %d has %d F, %d B, %d I, %d W; want one F and either one B or one I and one W", s.Name, st, i, f, b, in, w)
			}
		}
	}
	_, err := s.run(func(Action) float64 { return 1 }, 0)
	return err
}

// run executes the schedule under the given cost model and returns the
// start and end of every action, per rank in list order. Each action
// starts when its rank has finished the previous action and every
// dependency has finished (plus latency when it ran on another rank).
// It reports a deadlock, naming the blocked actions, if some rank cannot
// proceed. It assumes the counts Validate checks.
func (s Schedule) run(cost func(Action) float64, latency float64) ([][]Event, error) {
	S, m := s.NumStages(), s.Microbatches
	split := make([]bool, S*m)
	for _, list := range s.Actions {
		for _, a := range list {
			if a.Kind == BackwardInput {
				split[a.Stage*m+a.Microbatch] = true
			}
		}
	}
	isSplit := func(st, mb int) bool { return split[st*m+mb] }
	end := make(map[Action]float64, 3*S*m)
	events := make([][]Event, s.PP)
	free := make([]float64, s.PP)
	pos := make([]int, s.PP)
	for {
		progress, done := false, true
		for r, list := range s.Actions {
		next:
			for pos[r] < len(list) {
				a := list[pos[r]]
				start := free[r]
				for _, d := range deps(a, S, isSplit) {
					t, ok := end[d]
					if !ok {
						break next
					}
					if s.StageRank[d.Stage] != r {
						t += latency
					}
					start = max(start, t)
				}
				e := Event{Rank: r, Action: a, Start: start, End: start + cost(a)}
				end[a] = e.End
				free[r] = e.End
				events[r] = append(events[r], e)
				pos[r]++
				progress = true
			}
			if pos[r] < len(list) {
				done = false
			}
		}
		if done {
			return events, nil
		}
		if !progress {
			var blocked []string
			for r, list := range s.Actions {
				if pos[r] < len(list) {
					a := list[pos[r]]
					var missing []string
					for _, d := range deps(a, S, isSplit) {
						if _, ok := end[d]; !ok {
							missing = append(missing, d.String())
						}
					}
					blocked = append(blocked, fmt.Sprintf("rank %d at %v waits for %s", r, a, strings.Join(missing, ", ")))
				}
			}
			return nil, fmt.Errorf("pipeline: schedule %q deadlocks: %s", s.Name, strings.Join(blocked, "; "))
		}
	}
}
