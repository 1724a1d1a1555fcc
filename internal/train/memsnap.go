package train

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"github.com/titan-go/titan/internal/atomicfile"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/memplan"
	"github.com/titan-go/titan/internal/memsnap"
	"github.com/titan-go/titan/internal/parallel/fsdp"
)

// memSnapper writes memory snapshots ([profiling]
// enable_memory_snapshot): every profile_freq steps, as torchtitan, each
// rank records its memory over the step (package memsnap) and writes
// <dump>/<save_memory_snapshot_folder>/iteration_<S>/rank<R>_memory_snapshot.json
// and .svg.
//
// Through the whole run a memsnap.Watch also samples the rank's resident
// memory, and the first time it passes memsnap.NearFraction of what the
// rank may use (its resident memory at the start plus the memory then
// available, memplan.Available; TITAN_TEST_MEMORY_BUDGET, in bytes,
// replaces that budget in tests), the rank writes
// iteration_<S>/rank<R>_near_oom_memory_snapshot.json and .svg with the
// last samples: a rank the kernel kills for memory cannot write anything
// after the fact.
type memSnapper struct {
	tr    *Trainer
	freq  int
	dir   string
	host  string
	rec   *memsnap.Recorder
	watch *memsnap.Watch
	step  atomic.Int64 // the step in progress, for the watch
}

func (tr *Trainer) newMemSnapper(hosts []string) *memSnapper {
	p := tr.Job.Profiling
	if !p.EnableMemorySnapshot {
		return nil
	}
	m := &memSnapper{tr: tr, freq: p.ProfileFreq, dir: traceFolder(tr.Job.Job.DumpFolder, p.SaveMemorySnapshotFolder), host: hosts[tr.dist.Rank]}
	budget := int64(0)
	if v := os.Getenv("TITAN_TEST_MEMORY_BUDGET"); v != "" {
		budget, _ = strconv.ParseInt(v, 10, 64)
	} else if avail, err := memplan.Available(); err == nil {
		budget = memsnap.RSS() + avail
	}
	if budget > 0 {
		st, rank := m.static(), tr.dist.Rank
		m.watch = memsnap.StartWatch(memsnap.Probes{Gathered: fsdp.GatheredBytes, Comm: comm.InFlightBytes}, budget, func(samples []memsnap.Sample) {
			step := int(m.step.Load())
			s := memsnap.Of(rank, m.host, step, fmt.Sprintf("near out of memory: resident memory above %.0f%% of the rank's %.2f GiB", 100*memsnap.NearFraction, float64(budget)/(1<<30)), st, samples, memsnap.WatchEvery)
			base, err := m.write(s, "near_oom_memory_snapshot")
			if err != nil {
				fmt.Fprintf(os.Stderr, "titan: rank %d: near out of memory at step %d; writing the memory snapshot: %v\n", rank, step, err)
				return
			}
			fmt.Fprintf(os.Stderr, "titan: rank %d: warning: near out of memory at step %d (%.2f GiB resident of %.2f GiB); memory snapshot %s.json and .svg\n",
				rank, step, float64(samples[len(samples)-1].RSS)/(1<<30), float64(budget)/(1<<30), base)
		})
	}
	return m
}

// close stops the memory watch.
func (m *memSnapper) close() {
	if m != nil {
		m.watch.Stop()
	}
}

func (m *memSnapper) snapshotted(step int) bool { return step%m.freq == 0 }

// static is the rank's memory that does not change within a step.
func (m *memSnapper) static() memsnap.Static {
	tr := m.tr
	mem := tr.eng.Memory()
	return memsnap.Static{
		Parameters: int64(tr.eng.Params().Len) * 4, Gradients: int64(tr.eng.Grads().Len) * 4,
		Optimizer: int64(tr.Opt.M.Len+tr.Opt.V.Len) * 4, Activations: mem.ActivationBytes, UnitBuffers: mem.UnitBufferBytes,
	}
}

// beginStep starts sampling step when it is snapshotted.
func (m *memSnapper) beginStep(step int) {
	if m == nil {
		return
	}
	m.step.Store(int64(step))
	if !m.snapshotted(step) {
		return
	}
	m.rec = memsnap.Start(memsnap.Probes{Gathered: fsdp.GatheredBytes, Comm: comm.InFlightBytes,
		GatheredPeak: fsdp.GatheredPeak, CommPeak: comm.InFlightPeak})
}

// endStep writes the snapshot of step.
func (m *memSnapper) endStep(step int) error {
	if m == nil || m.rec == nil {
		return nil
	}
	tr := m.tr
	s := m.rec.Stop(tr.dist.Rank, m.host, step, m.static())
	m.rec = nil
	dir, err := m.write(s, "memory_snapshot")
	if err != nil {
		return err
	}
	dir = filepath.Dir(dir)
	if tr.dist.Rank == 0 {
		tr.log.Printf("titan: memory snapshot of step %d in %s (rank 0: %.1f MiB accounted, peak %.1f MiB resident, %.1f MiB of gathered units in use)",
			step, dir, float64(s.Accounted)/(1<<20), float64(s.PeakRSS)/(1<<20), float64(s.PeakGathered)/(1<<20))
	}
	return nil
}

// write writes s as iteration_<step>/rank<R>_<name>.json and .svg and
// returns the files' path without the extension.
func (m *memSnapper) write(s memsnap.Snapshot, name string) (string, error) {
	dir := filepath.Join(m.dir, fmt.Sprintf("iteration_%d", s.Step))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("memory snapshot: %w", err)
	}
	var js, svg bytes.Buffer
	if err := s.WriteJSON(&js); err != nil {
		return "", err
	}
	if err := s.WriteSVG(&svg); err != nil {
		return "", err
	}
	base := filepath.Join(dir, fmt.Sprintf("rank%d_%s", s.Rank, name))
	if err := atomicfile.WriteBytes(base+".json", js.Bytes()); err != nil {
		return "", fmt.Errorf("memory snapshot: %w", err)
	}
	if err := atomicfile.WriteBytes(base+".svg", svg.Bytes()); err != nil {
		return "", fmt.Errorf("memory snapshot: %w", err)
	}
	return base, nil
}
