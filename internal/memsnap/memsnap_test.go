package memsnap

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"
)

// TestRecorder: the samples follow the probes over the step, the peaks
// are their largest values, the accounted memory the static parts' sum;
// the JSON round-trips and the SVG is well-formed.
func TestRecorder(t *testing.T) {
	var g, c atomic.Int64
	r := Start(Probes{Gathered: g.Load, Comm: c.Load})
	g.Store(100)
	time.Sleep(5 * SampleEvery)
	g.Store(300)
	c.Store(50)
	time.Sleep(5 * SampleEvery)
	g.Store(0)
	c.Store(0)
	time.Sleep(3 * SampleEvery)
	st := Static{Parameters: 10, Gradients: 10, Optimizer: 20, Activations: 5, UnitBuffers: 600}
	s := r.Stop(2, "h", 7, st)
	if s.Accounted != 645 || s.PeakGathered != 300 || s.PeakComm != 50 || s.PeakRSS <= 0 || s.Step != 7 || s.Rank != 2 {
		t.Errorf("snapshot: accounted %d, peak gathered %d, comm %d, rss %d", s.Accounted, s.PeakGathered, s.PeakComm, s.PeakRSS)
	}
	if len(s.Samples) < 5 || s.Samples[0].MS > s.Samples[len(s.Samples)-1].MS || s.Samples[len(s.Samples)-1].GatheredUnits != 0 {
		t.Errorf("%d samples: %+v", len(s.Samples), s.Samples)
	}
	var b bytes.Buffer
	if err := s.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back Snapshot
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || back.Static != st || len(back.Samples) != len(s.Samples) {
		t.Errorf("JSON round trip: %v %+v", err, back.Static)
	}
	b.Reset()
	if err := s.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(&b)
	polys := 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && (se.Name.Local == "polygon" || se.Name.Local == "polyline") {
			polys++
		}
	}
	if polys != 8 { // 5 stacked parts, 3 lines
		t.Errorf("SVG has %d areas and lines, want 8", polys)
	}
}

// TestGaugePeaks: a level that rises and falls between two samples is
// in the step's snapshot through the gauges' high-water marks; a mark
// taken starts a new window at the level then; concurrent adds keep the
// level and the mark exact.
func TestGaugePeaks(t *testing.T) {
	var g, c Gauge
	g.Add(700) // before the step: not the step's peak
	g.Add(-700)
	r := Start(Probes{Gathered: g.Load, Comm: c.Load, GatheredPeak: g.TakePeak, CommPeak: c.TakePeak})
	g.Add(400) // up and down well inside one sampling interval
	c.Add(64)
	c.Add(-64)
	g.Add(-400)
	s := r.Stop(0, "h", 1, Static{})
	if s.PeakGathered != 400 || s.PeakComm != 64 {
		t.Errorf("peaks gathered %d, comm %d, want 400 and 64", s.PeakGathered, s.PeakComm)
	}
	g.Add(5)
	if p := g.TakePeak(); p != 5 {
		t.Errorf("mark after a window ending at 0 and a rise to 5: %d", p)
	}
	if p := g.TakePeak(); p != 5 {
		t.Errorf("a new window starts at the level now (5): %d", p)
	}
	g.Add(-5)
	done := make(chan bool)
	for w := 0; w < 4; w++ {
		go func() {
			for i := 0; i < 1000; i++ {
				g.Add(3)
				g.Add(-3)
			}
			done <- true
		}()
	}
	for w := 0; w < 4; w++ {
		<-done
	}
	if g.Load() != 0 || g.TakePeak() > 12 {
		t.Errorf("after concurrent adds: level %d", g.Load())
	}
}
