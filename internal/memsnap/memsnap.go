// Package memsnap records one rank's memory over a training step: the
// parts titan allocates for the run (parameters, gradients, optimizer
// state, activation buffers, the pool of FSDP unit buffers) and, sampled
// every SampleEvery while the step runs, what changes within it: the
// gathered FSDP unit parameters in use (buffers of the pool), the
// payload of the communication operations in flight (mostly buffers
// accounted above: gathered units, unit gradients; pipeline transfers
// are their own) and the process's resident memory. It writes the
// snapshot as JSON and an SVG chart ([profiling] enable_memory_snapshot).
package memsnap

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/titan-go/titan/internal/bytesize"
)

// SampleEvery is the sampling period during a step.
const SampleEvery = 500 * time.Microsecond

// Static is the memory that does not change within a step, in bytes.
type Static struct {
	Parameters  int64 `json:"parameters"`
	Gradients   int64 `json:"gradients"`
	Optimizer   int64 `json:"optimizer_state"`
	Activations int64 `json:"activations"`
	// UnitBuffers is the FSDP unit buffers allocated (gathered
	// parameters and unit gradients), the pool GatheredUnits draws from.
	UnitBuffers int64 `json:"fsdp_unit_buffers"`
}

// Total is the sum of the static parts.
func (s Static) Total() int64 {
	return s.Parameters + s.Gradients + s.Optimizer + s.Activations + s.UnitBuffers
}

// Sample is the changing memory at a time of the step.
type Sample struct {
	// MS is the time since the step began, in milliseconds.
	MS float64 `json:"ms"`
	// GatheredUnits is the gathered FSDP unit parameters in use,
	// CommBuffers the communication buffers in flight, RSS the process's
	// resident memory.
	GatheredUnits int64 `json:"gathered_units"`
	CommBuffers   int64 `json:"comm_buffers"`
	RSS           int64 `json:"rss"`
}

// Snapshot is one rank's memory over one step.
type Snapshot struct {
	Rank   int    `json:"rank"`
	Host   string `json:"host"`
	Step   int    `json:"step"`
	Reason string `json:"reason"`
	Static Static `json:"static"`
	// Accounted is the static parts' sum; Peak the sample of the step's
	// largest resident memory, PeakRSS that memory; PeakGathered and
	// PeakComm the largest of those samples over the step.
	Accounted    int64    `json:"accounted"`
	Peak         Sample   `json:"peak"`
	PeakRSS      int64    `json:"peak_rss"`
	PeakGathered int64    `json:"peak_gathered_units"`
	PeakComm     int64    `json:"peak_comm_buffers"`
	Samples      []Sample `json:"samples"`
	DurationMS   float64  `json:"duration_ms"`
	SampleEvery  string   `json:"sample_every"`
}

// Probes read the changing parts: their level now, and (when set) their
// high-water marks since the last call (Gauge.TakePeak), which a step's
// snapshot takes as its peaks when the samples missed them.
type Probes struct {
	Gathered, Comm         func() int64
	GatheredPeak, CommPeak func() int64
}

// Recorder samples one step.
type Recorder struct {
	start   time.Time
	probes  Probes
	stop    chan struct{}
	done    sync.WaitGroup
	samples []Sample
}

// Start begins sampling (a goroutine until Stop).
func Start(p Probes) *Recorder {
	for _, take := range []func() int64{p.GatheredPeak, p.CommPeak} {
		if take != nil {
			take() // the marks start with the step
		}
	}
	r := &Recorder{start: time.Now(), probes: p, stop: make(chan struct{})}
	r.sample()
	r.done.Add(1)
	go func() {
		defer r.done.Done()
		t := time.NewTicker(SampleEvery)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-t.C:
				r.sample()
			}
		}
	}()
	return r
}

func (r *Recorder) sample() {
	r.samples = append(r.samples, Sample{MS: float64(time.Since(r.start)) / 1e6, GatheredUnits: r.probes.Gathered(), CommBuffers: r.probes.Comm(), RSS: RSS()})
}

// Stop ends sampling and returns the step's snapshot.
func (r *Recorder) Stop(rank int, host string, step int, st Static) Snapshot {
	close(r.stop)
	r.done.Wait()
	r.sample()
	s := Of(rank, host, step, "step", st, r.samples, SampleEvery)
	s.DurationMS = float64(time.Since(r.start)) / 1e6
	if r.probes.GatheredPeak != nil {
		s.PeakGathered = max(s.PeakGathered, r.probes.GatheredPeak())
	}
	if r.probes.CommPeak != nil {
		s.PeakComm = max(s.PeakComm, r.probes.CommPeak())
	}
	return s
}

// RSS is the process's resident memory now (VmRSS), 0 where unknown.
func RSS() int64 {
	raw, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	var size, res int64
	fmt.Sscan(string(raw), &size, &res)
	return res * int64(os.Getpagesize())
}

// WriteJSON writes s.
func (s Snapshot) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(s)
}

// WriteSVG draws s: the accounted parts as stacked areas, the gathered
// units in use and the communication payload in flight as lines (within
// the pool and buffers above), the resident memory as a line, its peak
// marked.
func (s Snapshot) WriteSVG(w io.Writer) error {
	const W, H, left, right, top, bottom = 1000.0, 520.0, 80.0, 220.0, 40.0, 50.0
	hi := float64(max(s.Accounted, s.PeakRSS, 1)) * 1.05
	dur := math.Max(s.DurationMS, 1e-3)
	x := func(ms float64) float64 { return left + (W-left-right)*ms/dur }
	y := func(b float64) float64 { return H - bottom - (H-top-bottom)*b/hi }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="10" y="22" font-size="15" font-weight="bold">%s</text>`+"\n",
		html.EscapeString(fmt.Sprintf("titan: memory of rank %d (%s), step %d (%s); peak %s accounted, %s resident", s.Rank, s.Host, s.Step, s.Reason, bytesize.Human(s.Accounted), bytesize.Human(s.PeakRSS))))
	layers := []struct {
		name, col string
		at        func(Sample) int64
	}{
		{"parameters", "#2b6cb0", func(Sample) int64 { return s.Static.Parameters }},
		{"gradients", "#805ad5", func(Sample) int64 { return s.Static.Gradients }},
		{"optimizer state", "#dd6b20", func(Sample) int64 { return s.Static.Optimizer }},
		{"activations", "#38a169", func(Sample) int64 { return s.Static.Activations }},
		{"FSDP unit buffers", "#a0aec0", func(Sample) int64 { return s.Static.UnitBuffers }},
	}
	base := make([]float64, len(s.Samples))
	for li, l := range layers {
		var pts []string
		for i, sm := range s.Samples {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(sm.MS), y(base[i]+float64(l.at(sm)))))
		}
		for i := len(s.Samples) - 1; i >= 0; i-- {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.Samples[i].MS), y(base[i])))
		}
		for i, sm := range s.Samples {
			base[i] += float64(l.at(sm))
		}
		fmt.Fprintf(&b, `<polygon points="%s" fill="%s" fill-opacity="0.85"/>`+"\n", strings.Join(pts, " "), l.col)
		ly := top + 20*float64(li)
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="12" height="12" fill="%s"/><text x="%.0f" y="%.0f">%s</text>`+"\n", W-right+15, ly, l.col, W-right+32, ly+10, html.EscapeString(l.name))
	}
	lines := []struct {
		name, col string
		at        func(Sample) int64
	}{
		{"resident (RSS)", "#1a202c", func(x Sample) int64 { return x.RSS }},
		{"gathered units in use", "#d69e2e", func(x Sample) int64 { return x.GatheredUnits }},
		{"comm payload in flight", "#e53e3e", func(x Sample) int64 { return x.CommBuffers }},
	}
	for li, l := range lines {
		var pts []string
		for _, sm := range s.Samples {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(sm.MS), y(float64(l.at(sm)))))
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"/>`+"\n", strings.Join(pts, " "), l.col)
		ly := top + 20*float64(len(layers)+li)
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="%s" stroke-width="2"/><text x="%.0f" y="%.0f">%s</text>`+"\n", W-right+15, W-right+27, ly+6, ly+6, l.col, W-right+32, ly+10, html.EscapeString(l.name))
	}
	px := x(s.Peak.MS)
	fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#e53e3e" stroke-dasharray="4,3"/><text x="%.1f" y="%.0f" fill="#e53e3e">peak</text>`+"\n", px, px, top, H-bottom, px+3, top+12)
	// Axes.
	fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="#1a202c"/>`+"\n", left, W-right, H-bottom, H-bottom)
	fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="#1a202c"/>`+"\n", left, left, top, H-bottom)
	for i := 0; i <= 5; i++ {
		v := hi * float64(i) / 5
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-5, y(v)+4, bytesize.Human(int64(v)))
		ms := dur * float64(i) / 5
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%.1f ms</text>`+"\n", x(ms), H-bottom+18, ms)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// WatchEvery is the sampling period of a Watch, and WatchKeep how many of
// its latest samples a near-out-of-memory snapshot holds (the last 2 s).
const (
	WatchEvery = 20 * time.Millisecond
	WatchKeep  = 100
)

// NearFraction is the share of its memory budget at which a rank's Watch
// takes a snapshot: a process killed by the kernel's out-of-memory killer
// (or by the Go runtime's "out of memory") cannot write anything, so the
// snapshot is taken on the way there.
const NearFraction = 0.9

// Watch samples a process's memory through a whole run and calls near
// once, with its latest samples, the first time the resident memory
// exceeds NearFraction of budget.
type Watch struct {
	stop chan struct{}
	done sync.WaitGroup
}

// StartWatch begins watching; budget is the bytes the process may hold
// in all (its resident memory when it started plus what was available).
func StartWatch(p Probes, budget int64, near func(samples []Sample)) *Watch {
	w := &Watch{stop: make(chan struct{})}
	start := time.Now()
	limit := int64(NearFraction * float64(budget))
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		t := time.NewTicker(WatchEvery)
		defer t.Stop()
		ring := make([]Sample, 0, WatchKeep)
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
			x := Sample{MS: float64(time.Since(start)) / 1e6, GatheredUnits: p.Gathered(), CommBuffers: p.Comm(), RSS: RSS()}
			if len(ring) == WatchKeep {
				ring = append(ring[:0], ring[1:]...)
			}
			ring = append(ring, x)
			if x.RSS > limit {
				near(append([]Sample(nil), ring...))
				return
			}
		}
	}()
	return w
}

// Stop ends the watch.
func (w *Watch) Stop() {
	if w == nil {
		return
	}
	close(w.stop)
	w.done.Wait()
}

// Of builds a snapshot from samples (a Watch's), with the reason given.
func Of(rank int, host string, step int, reason string, st Static, samples []Sample, every time.Duration) Snapshot {
	s := Snapshot{Rank: rank, Host: host, Step: step, Reason: reason, Static: st, Samples: samples, SampleEvery: every.String()}
	s.Accounted = st.Total()
	for i, x := range samples {
		if i == 0 || x.RSS > s.PeakRSS {
			s.PeakRSS, s.Peak = x.RSS, x
		}
		s.PeakGathered = max(s.PeakGathered, x.GatheredUnits)
		s.PeakComm = max(s.PeakComm, x.CommBuffers)
	}
	if n := len(samples); n > 0 {
		s.DurationMS = samples[n-1].MS - samples[0].MS
	}
	return s
}
