package train

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/memsnap"
	"github.com/titan-go/titan/internal/parallel/fsdp"
)

// memSnapper writes memory snapshots ([profiling]
// enable_memory_snapshot): every profile_freq steps, as torchtitan, each
// rank records its memory over the step (package memsnap) and writes
// <dump>/<save_memory_snapshot_folder>/iteration_<S>/rank<R>_memory_snapshot.json
// and .svg.
type memSnapper struct {
	tr   *Trainer
	freq int
	dir  string
	host string
	rec  *memsnap.Recorder
}

func (tr *Trainer) newMemSnapper(hosts []string) *memSnapper {
	p := tr.Job.Profiling
	if !p.EnableMemorySnapshot {
		return nil
	}
	return &memSnapper{tr: tr, freq: p.ProfileFreq, dir: traceFolder(tr.Job.Job.DumpFolder, p.SaveMemorySnapshotFolder), host: hosts[tr.dist.Rank]}
}

func (m *memSnapper) snapshotted(step int) bool { return step%m.freq == 0 }

// beginStep starts sampling step when it is snapshotted.
func (m *memSnapper) beginStep(step int) {
	if m == nil || !m.snapshotted(step) {
		return
	}
	m.rec = memsnap.Start(memsnap.Probes{Gathered: fsdp.GatheredBytes, Comm: comm.InFlightBytes})
}

// endStep writes the snapshot of step.
func (m *memSnapper) endStep(step int) error {
	if m == nil || m.rec == nil {
		return nil
	}
	tr := m.tr
	mem := tr.eng.Memory()
	st := memsnap.Static{
		Parameters: int64(tr.eng.Params().Len) * 4, Gradients: int64(tr.eng.Grads().Len) * 4,
		Optimizer: int64(tr.Opt.M.Len+tr.Opt.V.Len) * 4, Activations: mem.ActivationBytes, UnitBuffers: mem.UnitBufferBytes,
	}
	s := m.rec.Stop(tr.dist.Rank, m.host, step, st)
	m.rec = nil
	dir := filepath.Join(m.dir, fmt.Sprintf("iteration_%d", step))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("memory snapshot: %w", err)
	}
	var js, svg bytes.Buffer
	if err := s.WriteJSON(&js); err != nil {
		return err
	}
	if err := s.WriteSVG(&svg); err != nil {
		return err
	}
	base := filepath.Join(dir, fmt.Sprintf("rank%d_memory_snapshot", tr.dist.Rank))
	if err := writeFileAtomic(base+".json", js.Bytes()); err != nil {
		return fmt.Errorf("memory snapshot: %w", err)
	}
	if err := writeFileAtomic(base+".svg", svg.Bytes()); err != nil {
		return fmt.Errorf("memory snapshot: %w", err)
	}
	if tr.dist.Rank == 0 {
		tr.log.Printf("titan: memory snapshot of step %d in %s (rank 0: %.1f MiB accounted, peak %.1f MiB resident, %.1f MiB of gathered units in use)",
			step, dir, float64(s.Accounted)/(1<<20), float64(s.PeakRSS)/(1<<20), float64(s.PeakGathered)/(1<<20))
	}
	return nil
}
