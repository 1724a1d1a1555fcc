package pipeline

import (
	"fmt"
	"math"
	"strings"
)

// Event is one action as a simulation ran it.
type Event struct {
	Rank       int
	Action     Action
	Start, End float64
}

// Timeline is the outcome of Schedule.Simulate.
type Timeline struct {
	// Schedule is the simulated schedule.
	Schedule Schedule
	// Events lists, per rank, the actions in the order they ran.
	Events [][]Event
	// Makespan is the time from the first start to the last end.
	Makespan float64
	// Busy and Idle are each rank's computing and waiting time within
	// the makespan; Busy[r] + Idle[r] = Makespan.
	Busy, Idle []float64
	// Bubble is the bubble fraction: total idle time divided by
	// Makespan × ranks.
	Bubble float64
	// PeakActivations is, per rank, the largest number of
	// (stage, microbatch) pairs whose Forward had started and whose
	// backward (Backward, or BackwardWeight when split) had not yet
	// finished. With one stage per rank it counts microbatches.
	PeakActivations []int
	// Err is non-nil when the schedule is invalid or the costs are
	// negative or not finite; the other fields are then zero.
	Err error
}

// Simulate runs the schedule under a cost model: stage st's Forward
// takes costs[st].Forward, its BackwardInput costs[st].Input, its
// BackwardWeight costs[st].Weight and its full Backward the last two
// together (costs has one entry per stage; see Uniform); an output
// crossing ranks arrives commLatency after the action that produced it
// ends, and same-rank
// dependencies are free. Each rank runs its list in order; an action
// starts as soon as its rank has finished the previous one and all its
// inputs have arrived. Since a rank's order is fixed, these start times
// are the earliest the schedule allows and do not depend on the order
// the simulation visits ranks in.
func (s Schedule) Simulate(costs []Costs, commLatency float64) Timeline {
	tl := Timeline{Schedule: s}
	if len(costs) != s.NumStages() {
		tl.Err = fmt.Errorf("pipeline: simulate %q: %d stage costs for %d stages", s.Name, len(costs), s.NumStages())
		return tl
	}
	if err := checkCosts(costs); err != nil {
		tl.Err = fmt.Errorf("pipeline: simulate %q: %w", s.Name, err)
		return tl
	}
	if commLatency < 0 || math.IsNaN(commLatency) || math.IsInf(commLatency, 0) {
		tl.Err = fmt.Errorf("pipeline: simulate %q: latency %g must be finite and >= 0", s.Name, commLatency)
		return tl
	}
	if err := s.Validate(); err != nil {
		tl.Err = err
		return tl
	}
	cost := func(a Action) float64 { return costs[a.Stage].of(a.Kind) }
	events, err := s.run(cost, commLatency)
	if err != nil {
		tl.Err = err
		return tl
	}
	tl.Events = events
	tl.Busy = make([]float64, s.PP)
	tl.Idle = make([]float64, s.PP)
	tl.PeakActivations = make([]int, s.PP)
	for r, evs := range events {
		held := 0
		for _, e := range evs {
			tl.Busy[r] += e.End - e.Start
			tl.Makespan = max(tl.Makespan, e.End)
			switch e.Action.Kind {
			case Forward:
				held++
				tl.PeakActivations[r] = max(tl.PeakActivations[r], held)
			case Backward, BackwardWeight:
				held--
			}
		}
	}
	var idle float64
	for r := range tl.Idle {
		tl.Idle[r] = tl.Makespan - tl.Busy[r]
		idle += tl.Idle[r]
	}
	if tl.Makespan > 0 {
		tl.Bubble = idle / (tl.Makespan * float64(s.PP))
	}
	return tl
}

// Render draws the timeline as a text Gantt chart, one row per rank.
// Time runs left to right in slots as long as the shortest action; each
// slot is a cell holding the kind letter (F, B, I, W) and microbatch
// index at an action's first slot, "-" on the slots it continues over,
// and "." where the rank is idle. A header names the schedule and a
// footer gives the makespan and bubble fraction.
func (t Timeline) Render() string {
	if t.Err != nil {
		return fmt.Sprintf("pipeline: cannot render: %v\n", t.Err)
	}
	s := t.Schedule
	quantum := math.Inf(1)
	for _, evs := range t.Events {
		for _, e := range evs {
			if d := e.End - e.Start; d > 0 {
				quantum = min(quantum, d)
			}
		}
	}
	if math.IsInf(quantum, 1) {
		quantum = 1
	}
	slot := func(x float64) int { return int(math.Round(x / quantum)) }
	width := len(fmt.Sprint(s.Microbatches-1)) + 2 // letter, digits, space
	slots := slot(t.Makespan)
	var b strings.Builder
	fmt.Fprintf(&b, "%s pp=%d virtual=%d microbatches=%d\n", s.Name, s.PP, s.Virtual, s.Microbatches)
	for r, evs := range t.Events {
		cells := make([]string, slots)
		for i := range cells {
			cells[i] = pad(".", width)
		}
		for _, e := range evs {
			a, z := slot(e.Start), slot(e.End)
			for c := a; c < z && c < slots; c++ {
				if c == a {
					cells[c] = pad(fmt.Sprintf("%v%d", e.Action.Kind, e.Action.Microbatch), width)
				} else {
					cells[c] = pad("-", width)
				}
			}
		}
		fmt.Fprintf(&b, "rank %d | %s\n", r, strings.TrimRight(strings.Join(cells, ""), " "))
	}
	fmt.Fprintf(&b, "makespan %.4g, bubble %.4f\n", t.Makespan, t.Bubble)
	return b.String()
}

func pad(s string, w int) string {
	if len(s) >= w {
		return s
	}
	return s + strings.Repeat(" ", w-len(s))
}
