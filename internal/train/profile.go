package train

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/titan-go/titan/internal/atomicfile"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/trace"
)

// profiler records the profiled steps of [profiling] (package trace) and
// has rank 0 write them, merged over the ranks, to
// <dump>/<save_traces_folder>/iteration_<S>/: trace.json (Chrome/Perfetto
// trace events, one process per rank on rank 0's clock), summary.txt and
// summary.json (per step and rank: compute, exposed communication,
// pipeline bubble, idle) and timeline.svg with timeline.png.
//
// The schedule is torchtitan's: every profile_freq steps the last
// profiler_active steps are recorded, after profiler_warmup steps that
// are recorded and thrown away; S is the window's last step.
type profiler struct {
	freq, warmup, active int
	total                int
	dir                  string
	rank, world          int
	group                comm.Group
	hosts                []string
	offset               int64 // add to this rank's clock to get rank 0's
	offsets              []int64
	stepStart            time.Time
	log                  func(format string, args ...any)
}

// profiling phases of a step
const (
	phaseOff = iota
	phaseWarmup
	phaseActive
)

// newProfiler measures the ranks' clock offsets to rank 0 (every rank
// takes part; ranks on rank 0's host share its clock) when profiling is
// on; nil when off.
func (tr *Trainer) newProfiler(hosts []string) (*profiler, error) {
	p := tr.Job.Profiling
	if !p.EnableProfiling {
		return nil, nil
	}
	pr := &profiler{freq: p.ProfileFreq, warmup: p.ProfilerWarmup, active: p.ProfilerActive, total: tr.Job.Training.Steps,
		dir: traceFolder(tr.Job.Job.DumpFolder, p.SaveTracesFolder), rank: tr.dist.Rank, world: tr.dist.World, group: tr.dist.Group,
		hosts: hosts, log: tr.log.Printf}
	var err error
	if pr.offsets, err = clockOffsets(pr.group, pr.rank, pr.world); err != nil {
		return nil, fmt.Errorf("profiling: measuring clock offsets: %w", err)
	}
	// Processes on rank 0's host read the same wall clock: their offset is
	// exactly 0, where a measurement would add up to half a round trip of
	// error (milliseconds on a loaded machine).
	for r := range pr.offsets {
		if r < len(hosts) && len(hosts) > 0 && hosts[r] == hosts[0] {
			pr.offsets[r] = 0
		}
	}
	pr.offset = pr.offsets[pr.rank]
	return pr, nil
}

// traceFolder resolves a folder relative to the dump folder.
func traceFolder(dump, sub string) string {
	if filepath.IsAbs(sub) {
		return sub
	}
	return filepath.Join(dump, sub)
}

// clockOffsets returns every rank's offset to rank 0's clock (on rank 0;
// on other ranks their own entry is set), by Cristian's method over the
// world group: five round trips per rank, the one of least round-trip
// time kept (the error is at most half of it).
func clockOffsets(g comm.Group, rank, world int) ([]int64, error) {
	out := make([]int64, world)
	if world == 1 {
		return out, nil
	}
	const rounds = 5
	buf := make([]int64, 1)
	if rank == 0 {
		for r := 1; r < world; r++ {
			for range rounds {
				if err := g.Recv(commCtx, comm.I64(buf), r); err != nil {
					return nil, err
				}
				buf[0] = time.Now().UnixNano()
				if err := g.Send(commCtx, comm.I64(buf), r); err != nil {
					return nil, err
				}
			}
			if err := g.Recv(commCtx, comm.I64(buf), r); err != nil {
				return nil, err
			}
			out[r] = buf[0]
		}
		return out, nil
	}
	best := int64(-1)
	for range rounds {
		t1 := time.Now().UnixNano()
		buf[0] = t1
		if err := g.Send(commCtx, comm.I64(buf), 0); err != nil {
			return nil, err
		}
		if err := g.Recv(commCtx, comm.I64(buf), 0); err != nil {
			return nil, err
		}
		t2 := time.Now().UnixNano()
		if rtt := t2 - t1; best < 0 || rtt < best {
			best = rtt
			out[rank] = buf[0] - (t1+t2)/2
		}
	}
	buf[0] = out[rank]
	return out, g.Send(commCtx, comm.I64(buf), 0)
}

func (p *profiler) phase(step int) int {
	pos := (step - 1) % p.freq
	switch {
	case pos >= p.freq-p.active:
		return phaseActive
	case pos >= p.freq-p.active-p.warmup:
		return phaseWarmup
	}
	return phaseOff
}

// steps lists the steps of phase ph in the window that ends at last.
func (p *profiler) steps(last, ph int) []int {
	out := []int{}
	for s := (last-1)/p.freq*p.freq + 1; s <= last; s++ {
		if p.phase(s) == ph {
			out = append(out, s)
		}
	}
	return out
}

// beginStep starts recording step when it is a warmup or active step.
func (p *profiler) beginStep(step int) {
	if p == nil {
		return
	}
	ph := p.phase(step)
	if ph == phaseOff {
		return
	}
	if ph == phaseActive && step > 1 && p.phase(step-1) == phaseWarmup {
		trace.Take() // the warmup's spans are thrown away
	}
	trace.Start(step)
	p.stepStart = time.Now()
}

// endStep closes step's span and, at the end of a window, writes it.
func (p *profiler) endStep(step int) error {
	if p == nil {
		return nil
	}
	ph := p.phase(step)
	if ph == phaseOff {
		return nil
	}
	trace.Interval(trace.CatStep, "step", trace.MainTrack, p.stepStart, time.Now(), 0)
	last := step == p.total
	if ph == phaseWarmup {
		if last {
			trace.Stop()
			trace.Take()
		}
		return nil
	}
	if step%p.freq != 0 && !last {
		return nil
	}
	trace.Stop()
	return p.flush(step, trace.Take())
}

// flush brings every rank's spans to rank 0, which writes the window.
func (p *profiler) flush(step int, spans []trace.Span) error {
	mine, err := json.Marshal(spans)
	if err != nil {
		return err
	}
	ranks := []trace.RankTrace{{Rank: p.rank, Host: p.hosts[p.rank], Offset: p.offset, Spans: spans}}
	if p.world > 1 {
		if p.rank != 0 {
			return sendBytes(p.group, mine)
		}
		for r := 1; r < p.world; r++ {
			b, err := recvBytes(p.group, r)
			if err != nil {
				return fmt.Errorf("profiling: receiving rank %d's trace: %w", r, err)
			}
			rt := trace.RankTrace{Rank: r, Host: p.hosts[r], Offset: p.offsets[r]}
			if err := json.Unmarshal(b, &rt.Spans); err != nil {
				return fmt.Errorf("profiling: rank %d's trace: %w", r, err)
			}
			ranks = append(ranks, rt)
		}
	}
	dir := filepath.Join(p.dir, fmt.Sprintf("iteration_%d", step))
	other := map[string]any{"profiled_steps": p.steps(step, phaseActive), "warmup_steps": p.steps(step, phaseWarmup),
		"profile_freq": p.freq, "profiler_active": p.active, "profiler_warmup": p.warmup, "clock_offsets_ns": p.offsets}
	if err := writeWindow(dir, ranks, other); err != nil {
		return fmt.Errorf("profiling: %w", err)
	}
	sums := trace.Summarize(ranks)
	p.log("titan: profile of %s written to %s (trace.json for ui.perfetto.dev or chrome://tracing, timeline.svg and .png)\n%s",
		trace.StepsLabel(trace.Steps(ranks)), dir, trace.FormatSummary(sums))
	return nil
}

// writeWindow writes trace.json, summary.txt, summary.json and
// timeline.svg|png of a window into dir, each by write-and-rename; the
// timeline's title names the window's steps.
func writeWindow(dir string, ranks []trace.RankTrace, other map[string]any) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var chrome, svg, pic bytes.Buffer
	if err := trace.WriteChrome(&chrome, ranks, other); err != nil {
		return err
	}
	title := trace.Title(ranks) // the steps it shows: the whole window
	if err := trace.WriteSVG(&svg, ranks, title); err != nil {
		return err
	}
	if err := trace.WritePNG(&pic, ranks, title); err != nil {
		return err
	}
	sums := trace.Summarize(ranks)
	js, err := json.MarshalIndent(sums, "", "  ")
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{"trace.json": chrome.Bytes(), "timeline.svg": svg.Bytes(), "timeline.png": pic.Bytes(),
		"summary.txt": []byte(trace.FormatSummary(sums)), "summary.json": js} {
		if err := atomicfile.WriteBytes(filepath.Join(dir, name), data); err != nil {
			return err
		}
	}
	return nil
}

// sendBytes sends b to rank 0: its length, then its bytes packed 8 to an
// int64.
func sendBytes(g comm.Group, b []byte) error {
	n := []int64{int64(len(b))}
	if err := g.Send(commCtx, comm.I64(n), 0); err != nil {
		return err
	}
	words := make([]int64, (len(b)+7)/8)
	padded := make([]byte, 8*len(words))
	copy(padded, b)
	for i := range words {
		words[i] = int64(binary.LittleEndian.Uint64(padded[8*i:]))
	}
	if len(words) == 0 {
		return nil
	}
	return g.Send(commCtx, comm.I64(words), 0)
}

func recvBytes(g comm.Group, from int) ([]byte, error) {
	n := []int64{0}
	if err := g.Recv(commCtx, comm.I64(n), from); err != nil {
		return nil, err
	}
	words := make([]int64, (n[0]+7)/8)
	if len(words) > 0 {
		if err := g.Recv(commCtx, comm.I64(words), from); err != nil {
			return nil, err
		}
	}
	b := make([]byte, 8*len(words))
	for i, w := range words {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(w))
	}
	return b[:n[0]], nil
}
