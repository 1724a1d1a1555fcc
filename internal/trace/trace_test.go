package trace

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"image/png"
	"strings"
	"testing"
	"time"
)

// TestOffRecordsNothingAndAllocatesNothing: with recording off a hook is
// free: no span, no allocation.
func TestOffRecordsNothingAndAllocatesNothing(t *testing.T) {
	Stop()
	Take()
	allocs := testing.AllocsPerRun(1000, func() {
		r := Begin(CatGEMM, "qkv")
		r.End()
		BeginAction("F", 0, 1).End()
		Interval(CatComm, "all_gather", "comm x", time.Time{}, time.Time{}, 8)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per off hook", allocs)
	}
	if n := len(Take()); n != 0 {
		t.Errorf("%d spans recorded while off", n)
	}
	Start(7)
	BeginAction("B", 1, 2).End()
	Stop()
	got := Take()
	if len(got) != 1 || got[0].Step != 7 || got[0].Stage != 1 || got[0].Microbatch != 2 || got[0].Track != MainTrack || got[0].Cat != CatPipeline {
		t.Errorf("recorded %+v", got)
	}
}

func ms(x float64) int64 { return int64(x * 1e6) }

// TestSummarize: nested spans resolve by class (bubble > exposed wait >
// compute > idle) and the classes add up to the step.
func TestSummarize(t *testing.T) {
	sp := func(cat string, a, b float64) Span {
		return Span{Name: cat, Cat: cat, Track: MainTrack, Start: ms(a), Dur: ms(b - a), Stage: -1, Microbatch: -1, Step: 3}
	}
	r := RankTrace{Rank: 1, Spans: []Span{
		sp(CatStep, 0, 100),
		sp(CatCompute, 10, 90),  // forward-backward
		sp(CatPipeline, 10, 40), // an action
		sp(CatGEMM, 12, 20),
		sp(CatWait, 20, 30),   // exposed all-gather inside the action
		sp(CatBubble, 40, 60), // waiting for the other stage
		sp(CatWait, 55, 65),   // overlaps the bubble: bubble wins for 55-60
		{Name: "all_gather", Cat: CatComm, Track: "comm dp", Start: ms(0), Dur: ms(100), Step: 3}, // other track: ignored
		sp(CatCheckpoint, 92, 96),
		sp(CatWait, 98, 130), // past the step: clipped
	}}
	got := Summarize([]RankTrace{r})
	if len(got) != 1 {
		t.Fatalf("%d summaries", len(got))
	}
	s := got[0]
	want := StepSummary{Step: 3, Rank: 1, Total: 100 * time.Millisecond, Compute: (10 + 10 + 25) * time.Millisecond,
		Exposed: (10 + 5 + 2) * time.Millisecond, Bubble: 20 * time.Millisecond, Idle: (10 + 8) * time.Millisecond}
	if s != want {
		t.Errorf("summary %+v\nwant    %+v", s, want)
	}
	if s.Compute+s.Exposed+s.Bubble+s.Idle != s.Total {
		t.Error("classes do not add up")
	}
	if tab := FormatSummary(got); !strings.Contains(tab, "45.000 ( 45.0)") || !strings.Contains(tab, "exposed comm") {
		t.Errorf("table:\n%s", tab)
	}
}

// TestWriteChromeSVGPNG: the merged trace has a process per rank named
// with its host, thread names per track, times shifted by each rank's
// offset; the SVG is well-formed XML and the PNG decodes.
func TestWriteChromeSVGPNG(t *testing.T) {
	ranks := []RankTrace{
		{Rank: 0, Host: "a", Spans: []Span{{Name: "step", Cat: CatStep, Track: MainTrack, Start: ms(1000), Dur: ms(10), Stage: -1, Microbatch: -1},
			{Name: "F", Cat: CatPipeline, Track: MainTrack, Start: ms(1001), Dur: ms(2), Stage: 0, Microbatch: 1}}},
		{Rank: 1, Host: "b", Offset: ms(500), Spans: []Span{{Name: "all_gather", Cat: CatComm, Track: "comm dp", Start: ms(502), Dur: ms(3), Bytes: 4096, Stage: -1, Microbatch: -1}}},
	}
	var b bytes.Buffer
	if err := WriteChrome(&b, ranks, map[string]any{"k": 1}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []chromeEvent  `json:"traceEvents"`
		OtherData   map[string]any `json:"otherData"`
	}
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	var ag, f *chromeEvent
	for i, e := range doc.TraceEvents {
		if n, ok := e.Args["name"].(string); ok && e.Ph == "M" {
			names[n] = true
		}
		switch e.Name {
		case "all_gather":
			ag = &doc.TraceEvents[i]
		case "F s0 mb1":
			f = &doc.TraceEvents[i]
		}
	}
	for _, n := range []string{"rank 0 (a)", "rank 1 (b)", "main", "comm dp"} {
		if !names[n] {
			t.Errorf("no metadata name %q", n)
		}
	}
	if ag == nil || f == nil || ag.TS != 2000 || ag.Dur != 3000 || ag.PID != 1 || ag.Args["bytes"] != 4096.0 || f.TS != 1000 || f.Args["stage"] != 0.0 {
		t.Errorf("events all_gather %+v F %+v", ag, f)
	}
	if doc.OtherData["k"] != 1.0 {
		t.Errorf("otherData %v", doc.OtherData)
	}
	b.Reset()
	if err := WriteSVG(&b, ranks, "t <&>"); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(&b)
	rects := 0
	for {
		tok, err := d.Token()
		if err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("SVG: %v", err)
			}
			break
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "rect" {
			rects++
		}
	}
	if rects < 3 {
		t.Errorf("SVG has %d rects", rects)
	}
	b.Reset()
	if err := WritePNG(&b, ranks, "t"); err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(&b); err != nil {
		t.Errorf("PNG: %v", err)
	}
}

// BenchmarkHookOff is the cost of a span hook while recording is off.
func BenchmarkHookOff(b *testing.B) {
	Stop()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		Begin(CatGEMM, "qkv").End()
	}
}

// BenchmarkHookOn is the cost of a recorded span.
func BenchmarkHookOn(b *testing.B) {
	Start(1)
	defer func() { Stop(); Take() }()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		Begin(CatGEMM, "qkv").End()
		if i%100000 == 0 {
			Take()
		}
	}
}

// TestTitle: a window's title names the steps whose step spans it holds
// (the whole window, not its last step), runs of steps as ranges.
func TestTitle(t *testing.T) {
	step := func(n int, cat, track string) Span {
		return Span{Name: "x", Cat: cat, Track: track, Step: n, Stage: -1, Microbatch: -1}
	}
	tests := []struct {
		steps []int
		want  string
	}{
		{nil, "titan: profiled no steps, 2 ranks"},
		{[]int{4}, "titan: profiled step 4, 2 ranks"},
		{[]int{4, 3}, "titan: profiled steps 3-4, 2 ranks"},
		{[]int{7, 1, 2, 3}, "titan: profiled steps 1-3, 7, 2 ranks"},
		{[]int{2, 4, 6}, "titan: profiled steps 2, 4, 6, 2 ranks"},
	}
	for _, tc := range tests {
		// rank 0 holds the step spans; rank 1 a duplicate of the first and
		// spans of other categories and tracks, which name no step
		ranks := []RankTrace{{Rank: 0}, {Rank: 1, Spans: []Span{step(99, CatGEMM, MainTrack), step(98, CatStep, "comm dp")}}}
		for _, n := range tc.steps {
			ranks[0].Spans = append(ranks[0].Spans, step(n, CatStep, MainTrack))
		}
		if len(tc.steps) > 0 {
			ranks[1].Spans = append(ranks[1].Spans, step(tc.steps[0], CatStep, MainTrack))
		}
		if got := Title(ranks); got != tc.want {
			t.Errorf("steps %v: %q, want %q", tc.steps, got, tc.want)
		}
	}
	if got := Title([]RankTrace{{Spans: []Span{step(5, CatStep, MainTrack)}}}); got != "titan: profiled step 5, 1 rank" {
		t.Errorf("one rank: %q", got)
	}
}
