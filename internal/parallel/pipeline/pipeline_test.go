package pipeline

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// grid is the table of (pp, v, m) every generator is built over; Build
// errors for combinations a schedule does not support are skipped.
func grid() []struct{ pp, v, m int } {
	var out []struct{ pp, v, m int }
	for _, pp := range []int{1, 2, 3, 4, 8} {
		for _, v := range []int{1, 2, 3} {
			for _, m := range []int{1, 2, 3, 4, 8, 12, 16} {
				out = append(out, struct{ pp, v, m int }{pp, v, m})
			}
		}
	}
	return out
}

// supported restates Build's documented rules.
func supported(name string, pp, v, m int) bool {
	switch name {
	case "GPipe":
		return v == 1
	case "1F1B":
		return v == 1 && m >= pp
	case "Interleaved1F1B":
		return v >= 2 && m%pp == 0
	case "LoopedBFS":
		return true
	case "InterleavedZeroBubble":
		return m >= pp
	case "ZBVZeroBubble":
		return v == 2 && m >= pp
	}
	return false
}

// built returns every schedule Build accepts over grid.
func built(t *testing.T) []Schedule {
	t.Helper()
	var out []Schedule
	for _, name := range Names {
		n := 0
		for _, g := range grid() {
			s, err := Build(name, g.pp, g.v, g.m, nil)
			if !supported(name, g.pp, g.v, g.m) {
				if err == nil {
					t.Errorf("Build(%s, %d, %d, %d) accepted an unsupported combination", name, g.pp, g.v, g.m)
				}
				continue
			}
			if err != nil {
				t.Fatalf("Build(%s, %d, %d, %d): %v", name, g.pp, g.v, g.m, err)
			}
			out = append(out, s)
			n++
		}
		if n == 0 {
			t.Fatalf("%s built for no grid point", name)
		}
	}
	return out
}

func TestBuildValidates(t *testing.T) {
	for _, s := range built(t) {
		id := fmt.Sprintf("%s pp=%d v=%d m=%d", s.Name, s.PP, s.Virtual, s.Microbatches)
		if err := s.Validate(); err != nil {
			t.Errorf("%s: %v", id, err)
			continue
		}
		// Independent count: every rank runs 2 or 3 actions per
		// (own stage, microbatch), only on its own stages.
		per := 2
		if strings.Contains(s.Name, "ZeroBubble") {
			per = 3
		}
		for r, list := range s.Actions {
			if got, want := len(list), per*s.Virtual*s.Microbatches; got != want {
				t.Errorf("%s rank %d: %d actions, want %d", id, r, got, want)
			}
			own := s.Stages(r)
			for _, a := range list {
				if !slices.Contains(own, a.Stage) {
					t.Errorf("%s rank %d runs %v of a stage it does not hold (%v)", id, r, a, own)
				}
			}
		}
		switch s.Name {
		case "ZBVZeroBubble":
			for r := range s.PP {
				if got := s.Stages(r); !slices.Equal(got, []int{r, 2*s.PP - 1 - r}) {
					t.Errorf("%s rank %d holds %v", id, r, got)
				}
			}
		default:
			for st, r := range s.StageRank {
				if r != st%s.PP {
					t.Errorf("%s stage %d on rank %d, want %d", id, st, r, st%s.PP)
				}
			}
		}
	}
}

func TestBuildErrors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pp, v, m  int
		wantInErr string
	}{
		{"Nope", 4, 1, 8, "valid schedules are GPipe, 1F1B"},
		{"DualPipeV", 4, 2, 8, "not implemented"},
		{"Interleaved1F1B", 4, 1, 8, "virtual >= 2"},
		{"Interleaved1F1B", 4, 2, 6, "multiple of pp=4"},
		{"Interleaved1F1B", 4, 2, 2, "multiple of pp=4"},
		{"GPipe", 4, 2, 8, "virtual=1"},
		{"1F1B", 4, 2, 8, "virtual=1"},
		{"1F1B", 4, 1, 3, "microbatches >= pp=4"},
		{"ZBV", 4, 3, 8, "virtual=2"},
		{"ZBVZeroBubble", 4, 2, 2, "microbatches >= pp=4"},
		{"InterleavedZeroBubble", 4, 2, 3, "microbatches >= pp=4"},
		{"GPipe", 0, 1, 8, "pp=0"},
		{"GPipe", 2, 1, 0, "microbatches=0"},
	} {
		_, err := Build(tc.name, tc.pp, tc.v, tc.m, nil)
		if err == nil || !strings.Contains(err.Error(), tc.wantInErr) {
			t.Errorf("Build(%q, %d, %d, %d) = %v, want error containing %q", tc.name, tc.pp, tc.v, tc.m, err, tc.wantInErr)
		}
	}
	for _, c := range []Costs{{1, -1, 1}, {math.NaN(), 1, 1}, {1, 1, math.Inf(1)}} {
		costs := Uniform(8, Costs{1, 1, 1})
		costs[5] = c
		if _, err := Build("ZBVZeroBubble", 4, 2, 8, costs); err == nil || !strings.Contains(err.Error(), "stage 5 costs") || !strings.Contains(err.Error(), "finite and non-negative") {
			t.Errorf("Build(ZBVZeroBubble, stage 5 costs %+v) = %v, want a refusal of the costs naming the stage", c, err)
		}
	}
	if _, err := Build("ZBVZeroBubble", 4, 2, 8, Uniform(6, Costs{1, 1, 1})); err == nil || !strings.Contains(err.Error(), "6 stage costs for 8 stages") {
		t.Errorf("Build(ZBVZeroBubble) with 6 costs for 8 stages = %v, want a refusal", err)
	}
	for _, name := range []string{"gpipe", "1f1b", "INTERLEAVED1F1B", "zbv", "ZBH1", "loopedbfs"} {
		if _, err := Canonical(name); err != nil {
			t.Errorf("Canonical(%q): %v", name, err)
		}
	}
}

func TestValidateRejects(t *testing.T) {
	good := func() Schedule {
		s, err := Build("1F1B", 2, 1, 2, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	F := func(s, i int) Action { return Action{Forward, s, i} }
	B := func(s, i int) Action { return Action{Backward, s, i} }
	I := func(s, i int) Action { return Action{BackwardInput, s, i} }
	W := func(s, i int) Action { return Action{BackwardWeight, s, i} }
	for _, tc := range []struct {
		what    string
		actions [][]Action
		want    string
	}{
		{"missing backward", [][]Action{{F(0, 0), F(0, 1), B(0, 0)}, {F(1, 0), B(1, 0), F(1, 1), B(1, 1)}}, "stage 0 microbatch 1"},
		{"duplicate forward", [][]Action{{F(0, 0), F(0, 0), F(0, 1), B(0, 0), B(0, 1)}, {F(1, 0), B(1, 0), F(1, 1), B(1, 1)}}, "2 F"},
		{"wrong rank", [][]Action{{F(0, 0), F(0, 1), B(0, 0), B(0, 1), F(1, 0)}, {B(1, 0), F(1, 1), B(1, 1)}}, "lives on rank 1"},
		{"mixed split", [][]Action{{F(0, 0), F(0, 1), B(0, 0), I(0, 1), B(0, 1)}, {F(1, 0), B(1, 0), F(1, 1), B(1, 1)}}, "1 B, 1 I, 0 W"},
		{"backward before forward", [][]Action{{F(0, 0), F(0, 1), B(0, 0), B(0, 1)}, {B(1, 0), F(1, 0), F(1, 1), B(1, 1)}}, "deadlocks"},
		{"W before I", [][]Action{{F(0, 0), F(0, 1), B(0, 0), B(0, 1)}, {F(1, 0), W(1, 0), I(1, 0), F(1, 1), B(1, 1)}}, "waits for I1/0"},
		{"cross-rank cycle", [][]Action{{F(0, 0), B(0, 0), F(0, 1), B(0, 1)}, {F(1, 1), F(1, 0), B(1, 0), B(1, 1)}}, "deadlocks"},
		{"out of range", [][]Action{{F(0, 0), F(0, 5), B(0, 0), B(0, 1)}, {F(1, 0), B(1, 0), F(1, 1), B(1, 1)}}, "out of range"},
	} {
		s := good()
		s.Actions = tc.actions
		err := s.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want error containing %q", tc.what, err, tc.want)
		}
		if tl := simulate(s, 1, 1, 0, 0); tl.Err == nil {
			t.Errorf("%s: Simulate accepted an invalid schedule", tc.what)
		}
	}
	s := good()
	s.StageRank = []int{0, 0}
	if err := s.Validate(); err == nil {
		t.Error("Validate accepted two stages on one rank with virtual=1")
	}
	if tl := simulate(good(), -1, 1, 0, 0); tl.Err == nil {
		t.Error("Simulate accepted a negative cost")
	}
}

// referenceTimes computes every action's start time independently of
// Simulate: as the longest path in the DAG of data dependencies and
// same-rank order, by relaxing all edges until nothing changes. Stage
// st's forward costs costF·scale(st), and so on.
func referenceTimes(s Schedule, costF, costB, costW, lat float64, scale func(int) float64) map[Action]float64 {
	kind := map[Kind]float64{Forward: costF, Backward: costB + costW, BackwardInput: costB, BackwardWeight: costW}
	cost := func(a Action) float64 { return kind[a.Kind] * scale(a.Stage) }
	rankOf := map[Action]int{}
	prev := map[Action]Action{}
	split := map[[2]int]bool{}
	for r, list := range s.Actions {
		for j, a := range list {
			rankOf[a] = r
			if j > 0 {
				prev[a] = list[j-1]
			}
			if a.Kind == BackwardInput {
				split[[2]int{a.Stage, a.Microbatch}] = true
			}
		}
	}
	S := s.NumStages()
	start := map[Action]float64{}
	for a := range rankOf {
		start[a] = 0
	}
	for changed := true; changed; {
		changed = false
		for a := range rankOf {
			var in []Action
			switch a.Kind {
			case Forward:
				if a.Stage > 0 {
					in = append(in, Action{Forward, a.Stage - 1, a.Microbatch})
				}
			case Backward, BackwardInput:
				in = append(in, Action{Forward, a.Stage, a.Microbatch})
				if a.Stage < S-1 {
					k := Backward
					if split[[2]int{a.Stage + 1, a.Microbatch}] {
						k = BackwardInput
					}
					in = append(in, Action{k, a.Stage + 1, a.Microbatch})
				}
			case BackwardWeight:
				in = append(in, Action{BackwardInput, a.Stage, a.Microbatch})
			}
			t := 0.0
			if p, ok := prev[a]; ok {
				t = start[p] + cost(p)
			}
			for _, d := range in {
				x := start[d] + cost(d)
				if rankOf[d] != rankOf[a] {
					x += lat
				}
				t = max(t, x)
			}
			if t > start[a] {
				start[a] = t
				changed = true
			}
		}
	}
	return start
}

// TestSimulateMatchesReference: every action starts when the reference
// says, with equal stages and with stages of different costs (a head
// stage three times as long, or costs rising with the stage).
func TestSimulateMatchesReference(t *testing.T) {
	costs := [][4]float64{{1, 1, 1, 0}, {1, 2, 0.5, 0.25}, {0.7, 1.3, 0, 1}}
	scales := map[string]func(S int) func(int) float64{
		"equal": func(int) func(int) float64 { return func(int) float64 { return 1 } },
		"head":  func(S int) func(int) float64 { return func(st int) float64 { return 1 + 2*float64(st/(S-1)) } },
		"rising": func(S int) func(int) float64 {
			return func(st int) float64 { return 0.5 + float64(st)/float64(S) }
		},
	}
	for _, s := range built(t) {
		if s.PP > 4 || s.Microbatches > 8 {
			continue // keep the quadratic reference fast
		}
		S := s.NumStages()
		for name, mk := range scales {
			scale := mk(max(S, 2))
			for _, c := range costs {
				per := make([]Costs, S)
				for st := range per {
					k := scale(st)
					per[st] = Costs{c[0] * k, c[1] * k, c[2] * k}
				}
				tl := s.Simulate(per, c[3])
				if tl.Err != nil {
					t.Fatalf("%s: %v", s.Name, tl.Err)
				}
				ref := referenceTimes(s, c[0], c[1], c[2], c[3], scale)
				var makespan, busy float64
				for r, evs := range tl.Events {
					if len(evs) != len(s.Actions[r]) {
						t.Fatalf("%s rank %d ran %d of %d actions", s.Name, r, len(evs), len(s.Actions[r]))
					}
					for _, e := range evs {
						if math.Abs(e.Start-ref[e.Action]) > 1e-9 {
							t.Fatalf("%s pp=%d v=%d m=%d costs %v, %s stages: %v starts at %g, reference %g", s.Name, s.PP, s.Virtual, s.Microbatches, c, name, e.Action, e.Start, ref[e.Action])
						}
						makespan = max(makespan, e.End)
						busy += e.End - e.Start
					}
				}
				want := 1 - busy/(makespan*float64(s.PP))
				if math.Abs(tl.Makespan-makespan) > 1e-9 || math.Abs(tl.Bubble-want) > 1e-12 {
					t.Fatalf("%s: makespan %g bubble %g, want %g %g", s.Name, tl.Makespan, tl.Bubble, makespan, want)
				}
			}
		}
	}
}

func TestBubbleMatchesTheory(t *testing.T) {
	for _, s := range built(t) {
		id := fmt.Sprintf("%s pp=%d v=%d m=%d", s.Name, s.PP, s.Virtual, s.Microbatches)
		th, _, err := Theoretical(s.Name, s.PP, s.Virtual, s.Microbatches)
		if err != nil {
			t.Fatal(err)
		}
		switch s.Name {
		case "GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS":
			if s.Name == "LoopedBFS" && s.Microbatches < s.PP {
				continue // the formula needs m >= pp
			}
			// Exact for equal F and B, for unequal ones, and for
			// a full backward of B+W.
			for _, c := range [][3]float64{{1, 1, 0}, {1, 2, 0}, {1, 1, 1}, {0.5, 1.5, 0.25}} {
				tl := simulate(s, c[0], c[1], c[2], 0)
				if math.Abs(tl.Bubble-th) > 1e-12 {
					t.Errorf("%s costs %v: bubble %.6f, theory %.6f", id, c, tl.Bubble, th)
				}
			}
		case "InterleavedZeroBubble", "ZBVZeroBubble":
			// Greedy orderings: never below the formula, and
			// within 0.02 of it (exact on most of the grid).
			tl := simulate(s, 1, 1, 1, 0)
			if tl.Bubble < th-1e-12 || tl.Bubble > th+0.02 {
				t.Errorf("%s: bubble %.6f, theory %.6f (tolerance +0.02)", id, tl.Bubble, th)
			}
		}
	}
	// ZB-H1 idles a third as long as 1F1B when F = B = W.
	for _, pp := range []int{2, 4, 8} {
		for _, m := range []int{8, 16} {
			a, _ := Build("1F1B", pp, 1, m, nil)
			z, _ := Build("InterleavedZeroBubble", pp, 1, m, nil)
			ia, iz := simulate(a, 1, 1, 1, 0).Idle, simulate(z, 1, 1, 1, 0).Idle
			for r := range pp {
				if math.Abs(iz[r]*3-ia[r]) > 1e-9 {
					t.Errorf("pp=%d m=%d rank %d: ZB-H1 idle %g, 1F1B idle %g, want a third", pp, m, r, iz[r], ia[r])
				}
			}
		}
	}
}

// TestZeroBubbleOrdersForItsCosts: ordered for a BackwardInput that
// costs twice a forward (a recomputing stage), the zero-bubble schedules
// keep their bubble shrinking with the microbatches, where the order
// made for equal costs stalls at a fifth to a third of the step; equal
// costs given or left zero build the same lists.
func TestZeroBubbleOrdersForItsCosts(t *testing.T) {
	ac := Costs{Forward: 1, Input: 2, Weight: 1}
	for _, name := range []string{"InterleavedZeroBubble", "ZBVZeroBubble"} {
		prev := 1.0
		for _, m := range []int{8, 16, 32} {
			fit, err := Build(name, 4, 2, m, Uniform(8, ac))
			if err != nil {
				t.Fatal(err)
			}
			unit, err := Build(name, 4, 2, m, nil)
			if err != nil {
				t.Fatal(err)
			}
			if ones, _ := Build(name, 4, 2, m, Uniform(8, Costs{1, 1, 1})); fmt.Sprint(ones.Actions) != fmt.Sprint(unit.Actions) {
				t.Errorf("%s m=%d: costs {1 1 1} order differently from no costs", name, m)
			}
			b := simulate(fit, ac.Forward, ac.Input, ac.Weight, 0).Bubble
			bu := simulate(unit, ac.Forward, ac.Input, ac.Weight, 0).Bubble
			// Both stay below Interleaved1F1B's bubble at v = 2.
			limit := (4 - 1) / float64(2*m+4-1)
			if b > limit || b >= bu || b >= prev {
				t.Errorf("%s m=%d: bubble %.3f ordered for the costs (equal costs' order: %.3f; m/2: %.3f), want below %.3f and shrinking", name, m, b, bu, prev, limit)
			}
			prev = b
		}
	}
}

// TestZBVOrdersForAHeavyHead: ordered for a last stage (the head) half
// again as long as the others, ZBV's bubble under those costs is no
// larger than that of the order made for equal stages, and smaller on
// two ranks.
func TestZBVOrdersForAHeavyHead(t *testing.T) {
	for _, pp := range []int{2, 4} {
		for _, m := range []int{8, 16} {
			S := 2 * pp
			even := Uniform(S, Costs{1, 2, 1})
			heavy := Uniform(S, Costs{1, 2, 1})
			heavy[S-1] = Costs{1.5, 3, 1.5}
			fit, err := Build("ZBV", pp, 2, m, heavy)
			if err != nil {
				t.Fatal(err)
			}
			blind, err := Build("ZBV", pp, 2, m, even)
			if err != nil {
				t.Fatal(err)
			}
			b, bb := fit.Simulate(heavy, 0).Bubble, blind.Simulate(heavy, 0).Bubble
			if b > bb || pp == 2 && b >= bb {
				t.Errorf("pp=%d m=%d: bubble %.4f ordered for the head's cost, %.4f ordered for equal stages; want no larger (smaller on 2 ranks)", pp, m, b, bb)
			}
		}
	}
}

// TestZeroBubbleKeepsTheBestOrder: stages priced like 8B's at pp4 under
// full checkpointing, one less layer on the first and last stage and
// the head (2.1 layers) on the last. The greedy order made for these
// costs runs them slower than the order made for their mean; Build
// keeps whichever of its candidate orders runs them fastest.
func TestZeroBubbleKeepsTheBestOrder(t *testing.T) {
	layers := []float64{4, 5, 4, 4, 4, 4, 4, 3}
	costs := make([]Costs, len(layers))
	var mean Costs
	for s, n := range layers {
		costs[s] = Costs{n, 2.07 * n, 0.93 * n}
	}
	costs[7] = Costs{costs[7].Forward + 2.1, costs[7].Input + 2.1, costs[7].Weight + 2.1}
	for _, c := range costs {
		mean = Costs{mean.Forward + c.Forward/8, mean.Input + c.Input/8, mean.Weight + c.Weight/8}
	}
	for _, name := range []string{"ZBVZeroBubble", "InterleavedZeroBubble"} {
		got, err := Build(name, 4, 2, 8, costs)
		if err != nil {
			t.Fatal(err)
		}
		end := got.Simulate(costs, 0).Makespan
		limitI := func(r int) int { return interleavedWarmup(4, 2, 8, r) + 1 }
		limitW := func(int) int { return limitI(0) + 2 }
		place := LoopPlacement(4, 2)
		if name == "ZBVZeroBubble" {
			limitI, limitW, place = func(int) int { return 8 }, func(int) int { return 8 }, VPlacement(4)
		}
		for cname, cand := range map[string][]Costs{"the stages' costs": costs, "their mean": Uniform(8, mean), "equal passes": nil} {
			if cand == nil {
				cand = Uniform(8, Costs{1, 1, 1})
			}
			alt, err := greedyZB(4, 2, 8, place, limitI, limitW, cand)
			if err != nil {
				t.Fatal(err)
			}
			if e := alt.Simulate(costs, 0).Makespan; e < end-1e-9 {
				t.Errorf("%s: the order made for %s ends at %.2f, before Build's %.2f", name, cname, e, end)
			}
		}
	}
	own, _ := greedyZB(4, 2, 8, VPlacement(4), func(int) int { return 8 }, func(int) int { return 8 }, costs)
	zbv, _ := Build("ZBV", 4, 2, 8, costs)
	if b, o := zbv.Simulate(costs, 0).Bubble, own.Simulate(costs, 0).Bubble; b > 0.2 || o < 0.25 {
		t.Errorf("ZBV: bubble %.3f kept, %.3f ordered for the stages' costs alone; want below 0.2 against above 0.25", b, o)
	}
}

func TestPeakActivations(t *testing.T) {
	for _, s := range built(t) {
		tl := simulate(s, 1, 1, 1, 0)
		for r, got := range tl.PeakActivations {
			var want int
			switch s.Name {
			case "GPipe":
				want = s.Microbatches
			case "1F1B":
				want = min(s.PP-r, s.Microbatches)
			case "LoopedBFS":
				want = s.Virtual * s.Microbatches
			case "Interleaved1F1B":
				want = interleavedWarmup(s.PP, s.Virtual, s.Microbatches, r) + 1
			case "InterleavedZeroBubble":
				if lim := interleavedWarmup(s.PP, s.Virtual, s.Microbatches, 0) + 1 + s.PP/2; got > lim {
					t.Errorf("InterleavedZeroBubble pp=%d v=%d m=%d rank %d: peak %d > %d", s.PP, s.Virtual, s.Microbatches, r, got, lim)
				}
				continue
			case "ZBVZeroBubble":
				if got > 2*s.PP {
					t.Errorf("ZBV pp=%d m=%d rank %d: peak %d > 2pp", s.PP, s.Microbatches, r, got)
				}
				continue
			default:
				continue
			}
			want = min(want, s.Virtual*s.Microbatches)
			if got != want {
				t.Errorf("%s pp=%d v=%d m=%d rank %d: peak %d, want %d", s.Name, s.PP, s.Virtual, s.Microbatches, r, got, want)
			}
			if s.Name == "1F1B" && got > s.PP {
				t.Errorf("1F1B rank %d peak %d > pp", r, got)
			}
		}
	}
}

// TestGPipeLatency checks the closed form (m+pp-1)(F+B) + 2(pp-1)·c
// for GPipe with transfer latency c.
func TestGPipeLatency(t *testing.T) {
	for _, tc := range []struct{ pp, m int }{{2, 3}, {4, 8}, {8, 4}} {
		s, err := Build("GPipe", tc.pp, 1, tc.m, nil)
		if err != nil {
			t.Fatal(err)
		}
		const f, b, c = 1.0, 2.0, 0.3
		tl := simulate(s, f, b, 0, c)
		want := float64(tc.m+tc.pp-1)*(f+b) + 2*float64(tc.pp-1)*c
		if math.Abs(tl.Makespan-want) > 1e-9 {
			t.Errorf("pp=%d m=%d: makespan %g, want %g", tc.pp, tc.m, tl.Makespan, want)
		}
	}
}

func TestRender(t *testing.T) {
	s, _ := Build("ZBV", 2, 2, 4, nil)
	out := simulate(s, 1, 1, 1, 0).Render()
	if got := strings.Count(out, "rank "); got != 2 {
		t.Errorf("render has %d rank rows, want 2:\n%s", got, out)
	}
	for _, want := range []string{"ZBVZeroBubble pp=2", "F0", "I3", "W3", "bubble"} {
		if !strings.Contains(out, want) {
			t.Errorf("render lacks %q:\n%s", want, out)
		}
	}
}

func TestReport(t *testing.T) {
	out, err := Report(Names, 4, 2, 8)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range Names {
		if !strings.Contains(out, n) {
			t.Errorf("report lacks %s:\n%s", n, out)
		}
	}
	if _, err := Report([]string{"nope"}, 4, 2, 8); err == nil {
		t.Error("Report accepted an unknown schedule")
	}
}

func ExampleTimeline_Render() {
	s, err := Build("1F1B", 4, 1, 8, nil)
	if err != nil {
		panic(err)
	}
	fmt.Print(simulate(s, 1, 1, 0, 0).Render())
	// Output:
	// 1F1B pp=4 virtual=1 microbatches=8
	// rank 0 | F0 F1 F2 F3 .  .  .  B0 F4 B1 F5 B2 F6 B3 F7 B4 .  B5 .  B6 .  B7
	// rank 1 | .  F0 F1 F2 .  .  B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 .  B6 .  B7 .
	// rank 2 | .  .  F0 F1 .  B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 .  B7 .  .
	// rank 3 | .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 .  .  .
	// makespan 22, bubble 0.2727
}

// BenchmarkBuildSimulate times building and simulating schedules for
// pp=8 and 32 microbatches.
func BenchmarkBuildSimulate(b *testing.B) {
	for _, tc := range []struct {
		name string
		v    int
	}{{"1F1B", 1}, {"Interleaved1F1B", 2}, {"InterleavedZeroBubble", 2}, {"ZBVZeroBubble", 2}} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				s, err := Build(tc.name, 8, tc.v, 32, nil)
				if err != nil {
					b.Fatal(err)
				}
				if tl := simulate(s, 1, 1, 1, 0); tl.Err != nil {
					b.Fatal(tl.Err)
				}
			}
		})
	}
}

// TestActivationSets checks the activation sets a rank's list needs
// against the schedules' known in-flight counts: GPipe keeps every
// microbatch, 1F1B pp-r on rank r; and, for a hand-written split list,
// the sets and the microbatches between their two backward halves.
func TestActivationSets(t *testing.T) {
	for _, c := range []struct {
		name      string
		pp, m     int
		rank, max int
	}{
		{"GPipe", 4, 8, 0, 8},
		{"1F1B", 4, 8, 0, 4},
		{"1F1B", 4, 8, 3, 1},
		{"1F1B", 2, 2, 0, 2},
	} {
		s, err := Build(c.name, c.pp, 1, c.m, nil)
		if err != nil {
			t.Fatal(err)
		}
		peak, split := s.ActivationSets(c.rank)
		if got := peak[s.Stages(c.rank)[0]]; got != c.max || split != nil {
			t.Errorf("%s pp %d m %d rank %d: %d sets (split %v), want %d (none)", c.name, c.pp, c.m, c.rank, got, split, c.max)
		}
	}
	// F0 F1 I0 F2 I1 W0 I2 W1 W2: three forwards before the first
	// BackwardWeight frees a set; I0 and I1, then I1 and I2, await theirs.
	F := func(i int) Action { return Action{Forward, 0, i} }
	I := func(i int) Action { return Action{BackwardInput, 0, i} }
	W := func(i int) Action { return Action{BackwardWeight, 0, i} }
	s := newSchedule(1, 1, 3, LoopPlacement(1, 1))
	s.Actions[0] = []Action{F(0), F(1), I(0), F(2), I(1), W(0), I(2), W(1), W(2)}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if peak, split := s.ActivationSets(0); peak[0] != 3 || split[0] != 2 {
		t.Errorf("split list: %d sets and %d split backwards at once, want 3 and 2", peak[0], split[0])
	}
}

// simulate runs s with every stage's costs f, b, w and latency lat.
func simulate(s Schedule, f, b, w, lat float64) Timeline {
	return s.Simulate(Uniform(s.NumStages(), Costs{f, b, w}), lat)
}
