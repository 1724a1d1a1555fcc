package trace

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"
)

// RankTrace is one rank's spans of a profiling window.
type RankTrace struct {
	Rank int    `json:"rank"`
	Host string `json:"host"`
	// Offset is added to the rank's span times to put them on rank 0's
	// clock (measured at the start of the run, see train).
	Offset int64  `json:"offset_ns"`
	Spans  []Span `json:"spans"`
}

// origin is the earliest aligned span start of ranks.
func origin(ranks []RankTrace) int64 {
	first := int64(0)
	for _, r := range ranks {
		for _, s := range r.Spans {
			if t := s.Start + r.Offset; first == 0 || t < first {
				first = t
			}
		}
	}
	return first
}

// tracks lists a rank's tracks, the main track first.
func tracks(r RankTrace) []string {
	seen := map[string]bool{MainTrack: true}
	out := []string{MainTrack}
	for _, s := range r.Spans {
		if !seen[s.Track] {
			seen[s.Track] = true
			out = append(out, s.Track)
		}
	}
	slices.Sort(out[1:])
	return out
}

type chromeEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	TS   float64        `json:"ts"`
	Dur  float64        `json:"dur,omitempty"`
	PID  int            `json:"pid"`
	TID  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// WriteChrome writes the ranks' spans as one Chrome trace-event JSON
// (the format of chrome://tracing and ui.perfetto.dev): a process per
// rank ("rank R (host)"), a thread per track, complete ("X") events with
// microsecond times on rank 0's clock from the window's first span.
//
// other is written as the trace's "otherData" (shown by the viewers as
// the trace's metadata).
func WriteChrome(w io.Writer, ranks []RankTrace, other map[string]any) error {
	t0 := origin(ranks)
	var evs []chromeEvent
	for _, r := range ranks {
		evs = append(evs,
			chromeEvent{Name: "process_name", Ph: "M", PID: r.Rank, Args: map[string]any{"name": fmt.Sprintf("rank %d (%s)", r.Rank, r.Host)}},
			chromeEvent{Name: "process_sort_index", Ph: "M", PID: r.Rank, Args: map[string]any{"sort_index": r.Rank}})
		tid := map[string]int{}
		for i, tr := range tracks(r) {
			tid[tr] = i
			evs = append(evs, chromeEvent{Name: "thread_name", Ph: "M", PID: r.Rank, TID: i, Args: map[string]any{"name": tr}},
				chromeEvent{Name: "thread_sort_index", Ph: "M", PID: r.Rank, TID: i, Args: map[string]any{"sort_index": i}})
		}
		for _, s := range r.Spans {
			args := map[string]any{"step": s.Step}
			if s.Bytes > 0 {
				args["bytes"] = s.Bytes
			}
			if s.Stage >= 0 {
				args["stage"], args["microbatch"] = s.Stage, s.Microbatch
			}
			name := s.Name
			if s.Cat == CatPipeline {
				name = fmt.Sprintf("%s s%d mb%d", s.Name, s.Stage, s.Microbatch)
			}
			evs = append(evs, chromeEvent{Name: name, Cat: s.Cat, Ph: "X", PID: r.Rank, TID: tid[s.Track],
				TS: float64(s.Start+r.Offset-t0) / 1e3, Dur: float64(s.Dur) / 1e3, Args: args})
		}
	}
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	if err := enc.Encode(map[string]any{"traceEvents": evs, "displayTimeUnit": "ms", "otherData": other}); err != nil {
		return err
	}
	return bw.Flush()
}

// StepSummary is where one rank's time of one profiled step went. The
// classes do not overlap and add up to Total: Bubble is time blocked on a
// pipeline transfer, Exposed time blocked on a collective, Compute time
// in a compute span (forward-backward, grad norm, optimizer, their
// kernels) otherwise, Idle the rest (data loading, host overhead,
// checkpoint writes).
type StepSummary struct {
	Step, Rank                            int
	Total, Compute, Exposed, Bubble, Idle time.Duration
}

// busyCats are the categories that count as compute.
var busyCats = map[string]bool{CatCompute: true, CatPipeline: true, CatGEMM: true, CatAttention: true, CatNorm: true, CatElementw: true, CatOptimizer: true}

// class of a main-track span: 3 bubble, 2 exposed, 1 compute, 0 none.
func class(cat string) int {
	switch {
	case cat == CatBubble:
		return 3
	case cat == CatWait:
		return 2
	case busyCats[cat]:
		return 1
	}
	return 0
}

// Summarize splits every step span of every rank into StepSummary
// classes, the higher class winning where spans nest (a wait inside a
// forward is exposed communication, not compute).
func Summarize(ranks []RankTrace) []StepSummary {
	var out []StepSummary
	for _, r := range ranks {
		for _, st := range r.Spans {
			if st.Cat != CatStep || st.Track != MainTrack {
				continue
			}
			lo, hi := st.Start, st.Start+st.Dur
			type ev struct {
				t     int64
				c, dv int
			}
			var evs []ev
			for _, s := range r.Spans {
				c := class(s.Cat)
				if c == 0 || s.Track != MainTrack {
					continue
				}
				a, b := max(s.Start, lo), min(s.Start+s.Dur, hi)
				if a >= b {
					continue
				}
				evs = append(evs, ev{a, c, 1}, ev{b, c, -1})
			}
			sort.Slice(evs, func(i, j int) bool { return evs[i].t < evs[j].t })
			var count [4]int
			var by [4]int64
			prev := lo
			for _, e := range evs {
				top := 0
				for c := 3; c > 0; c-- {
					if count[c] > 0 {
						top = c
						break
					}
				}
				by[top] += e.t - prev
				prev = e.t
				count[e.c] += e.dv
			}
			by[0] += hi - prev
			out = append(out, StepSummary{Step: st.Step, Rank: r.Rank, Total: time.Duration(st.Dur),
				Idle: time.Duration(by[0]), Compute: time.Duration(by[1]), Exposed: time.Duration(by[2]), Bubble: time.Duration(by[3])})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Step != out[j].Step {
			return out[i].Step < out[j].Step
		}
		return out[i].Rank < out[j].Rank
	})
	return out
}

// FormatSummary renders the summaries as a text table: one row per step
// and rank, milliseconds and percent of the step.
func FormatSummary(sums []StepSummary) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%5s %5s %10s %18s %18s %18s %18s\n", "step", "rank", "total ms", "compute ms (%)", "exposed comm ms (%)", "bubble ms (%)", "idle ms (%)")
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	for _, s := range sums {
		pc := func(d time.Duration) float64 { return 100 * float64(d) / float64(max(s.Total, 1)) }
		fmt.Fprintf(&b, "%5d %5d %10.3f %10.3f (%5.1f) %11.3f (%5.1f) %10.3f (%5.1f) %10.3f (%5.1f)\n", s.Step, s.Rank, ms(s.Total),
			ms(s.Compute), pc(s.Compute), ms(s.Exposed), pc(s.Exposed), ms(s.Bubble), pc(s.Bubble), ms(s.Idle), pc(s.Idle))
	}
	return b.String()
}

// Steps lists, in order, the steps whose step spans (CatStep on the main
// track) the window holds: the steps its pictures show.
func Steps(ranks []RankTrace) []int {
	seen := map[int]bool{}
	var out []int
	for _, r := range ranks {
		for _, s := range r.Spans {
			if s.Cat == CatStep && s.Track == MainTrack && !seen[s.Step] {
				seen[s.Step] = true
				out = append(out, s.Step)
			}
		}
	}
	sort.Ints(out)
	return out
}

// StepsLabel names steps: "step 4", "steps 3-4", "steps 1-3, 7" (runs
// of consecutive steps as ranges), "no steps".
func StepsLabel(steps []int) string {
	var parts []string
	for i := 0; i < len(steps); {
		j := i
		for j+1 < len(steps) && steps[j+1] == steps[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", steps[i], steps[j]))
		} else {
			parts = append(parts, fmt.Sprint(steps[i]))
		}
		i = j + 1
	}
	switch len(steps) {
	case 0:
		return "no steps"
	case 1:
		return "step " + parts[0]
	}
	return "steps " + strings.Join(parts, ", ")
}

// Title is a window's timeline title: the steps it shows (Steps) and its
// ranks, e.g. "titan: profiled steps 3-4, 4 ranks".
func Title(ranks []RankTrace) string {
	rk := "ranks"
	if len(ranks) == 1 {
		rk = "rank"
	}
	return fmt.Sprintf("titan: profiled %s, %d %s", StepsLabel(Steps(ranks)), len(ranks), rk)
}
