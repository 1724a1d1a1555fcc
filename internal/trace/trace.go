// Package trace records a process's spans — named, timed intervals with a
// category, a track and optional bytes, pipeline stage and microbatch —
// while recording is on (the profiled steps of [profiling]), for the
// Chrome/Perfetto trace that package train writes (see Merge and
// WriteChrome).
//
// Recording is process-wide: the trainer turns it on for a profiled step
// and the hooks in the engine, the model, the pipeline executor and the
// collectives (package comm) add their spans. Off, a hook costs one atomic
// load and allocates nothing: Begin returns a zero Region whose End does
// nothing.
package trace

import (
	"sync"
	"sync/atomic"
	"time"
)

// Span categories. The per-step summary classifies time by them: Wait
// is exposed communication (a rank blocked on a collective), Bubble a
// pipeline stage blocked on a point-to-point transfer, the compute
// categories are time computing; Comm spans are collectives on their own
// track (running while the rank computes, when overlapped).
const (
	CatStep       = "step"
	CatCompute    = "compute" // a phase of the step: forward-backward, grad norm, optimizer
	CatPipeline   = "pipeline"
	CatGEMM       = "gemm"
	CatAttention  = "attention"
	CatNorm       = "norm"
	CatElementw   = "elementwise"
	CatOptimizer  = "optimizer"
	CatCheckpoint = "checkpoint"
	CatComm       = "comm"
	CatWait       = "wait"
	CatBubble     = "bubble"
)

// MainTrack is the track of the training goroutine.
const MainTrack = "main"

// Span is one recorded interval. Start is in Unix nanoseconds of the
// recording process's clock.
type Span struct {
	Name  string `json:"name"`
	Cat   string `json:"cat"`
	Track string `json:"track"`
	Start int64  `json:"start"`
	Dur   int64  `json:"dur"`
	// Bytes is the payload of a collective or a transfer (0: none).
	Bytes int64 `json:"bytes,omitempty"`
	// Stage and Microbatch locate a pipeline action (-1: none).
	Stage      int `json:"stage"`
	Microbatch int `json:"microbatch"`
	// Step is the training step the span belongs to.
	Step int `json:"step"`
}

var (
	on    atomic.Bool
	mu    sync.Mutex
	spans []Span
	step  atomic.Int64
)

// Enabled reports whether spans are being recorded.
func Enabled() bool { return on.Load() }

// Start begins recording step's spans (clearing nothing: several steps of
// one window accumulate until Take).
func Start(stepNo int) {
	step.Store(int64(stepNo))
	on.Store(true)
}

// Stop stops recording.
func Stop() { on.Store(false) }

// Take returns the recorded spans and forgets them.
func Take() []Span {
	mu.Lock()
	defer mu.Unlock()
	out := spans
	spans = nil
	return out
}

// Add records s (when recording), stamping the current step.
func Add(s Span) {
	if !on.Load() {
		return
	}
	s.Step = int(step.Load())
	mu.Lock()
	spans = append(spans, s)
	mu.Unlock()
}

// Region is a span being timed on the main track; the zero Region (from
// Begin while off) records nothing.
type Region struct {
	name, cat string
	start     int64
	stage, mb int
	bytes     int64
}

// Begin starts timing a span of cat on the main track.
func Begin(cat, name string) Region {
	if !on.Load() {
		return Region{}
	}
	return Region{name: name, cat: cat, start: time.Now().UnixNano(), stage: -1, mb: -1}
}

// BeginAction starts timing pipeline action name of stage and microbatch.
func BeginAction(name string, stage, microbatch int) Region {
	r := Begin(CatPipeline, name)
	r.stage, r.mb = stage, microbatch
	return r
}

// End records the span.
func (r Region) End() {
	if r.start == 0 {
		return
	}
	Add(Span{Name: r.name, Cat: r.cat, Track: MainTrack, Start: r.start, Dur: time.Now().UnixNano() - r.start,
		Bytes: r.bytes, Stage: r.stage, Microbatch: r.mb})
}

// Interval records a finished span of cat on track from start to end
// (collectives: their own track; waits: the main track).
func Interval(cat, name, track string, start, end time.Time, bytes int64) {
	if !on.Load() {
		return
	}
	Add(Span{Name: name, Cat: cat, Track: track, Start: start.UnixNano(), Dur: int64(end.Sub(start)), Bytes: bytes, Stage: -1, Microbatch: -1})
}
