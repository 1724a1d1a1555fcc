package memsnap

import "sync/atomic"

// Gauge is a level that rises and falls (bytes in use) with its
// high-water mark, safe for concurrent use: what a snapshot probes. A
// sampled level misses a peak shorter than the sampling interval; the
// mark does not.
type Gauge struct{ cur, peak atomic.Int64 }

// Add changes the level by n and raises the mark to it.
func (g *Gauge) Add(n int64) {
	v := g.cur.Add(n)
	for {
		p := g.peak.Load()
		if v <= p || g.peak.CompareAndSwap(p, v) {
			return
		}
	}
}

// Load is the level now.
func (g *Gauge) Load() int64 { return g.cur.Load() }

// TakePeak returns the highest level since the last TakePeak (or since
// the start) and begins a new window at the level now.
func (g *Gauge) TakePeak() int64 { return g.peak.Swap(g.cur.Load()) }
