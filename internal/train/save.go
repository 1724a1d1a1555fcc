package train

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/hf"
	"github.com/titan-go/titan/internal/hostmem"
	"github.com/titan-go/titan/internal/modelfile"
)

// Saving a checkpoint
//
// Every rank saves its own part of the state; nothing is gathered. A
// save first takes a snapshot, on the training goroutine: the rank's
// parameters and (for a full save) optimizer moments are copied into
// host buffers, cut into the ranges of the whole tensors this rank
// writes (parallel.Engine.Shards), and rank 0 adds the small states
// (train state, data loaders, model description, tokenizer). Writing
// the snapshot is then the checkpoint package's per-rank protocol: each
// rank writes its data file and part file into the step's temporary
// folder (named after the job's session, which every rank knows), and
// rank 0 waits for every rank's part, merges them, writes the commit
// marker last and renames the folder into place. That handshake is on
// files, not collectives, so it may run on a background goroutine of
// each rank without racing the training collectives on the same groups.
//
// checkpoint.async_mode:
//   - "disabled": the training loop waits for the write (on rank 0, for
//     the commit).
//   - "async": the write runs on a background goroutine while training
//     goes on; the snapshot is a fresh host copy, freed once written.
//   - "async_with_pinned_mem": as "async", but the snapshot buffers are
//     allocated once and reused by every save (on a CPU "pinned" memory
//     is plain host memory: what it buys is no allocation per save, at
//     the cost of keeping the snapshot resident).
//
// At most one save is in flight: a save waits for the previous one, the
// final save and every exit from the loop wait for it, and the error of
// a background save fails the run at the next step (or at the exit)
// instead of being lost. Each save logs how long it blocked the loop, as
// a share of a training step, and how long it took to write.

// asyncSave is one save being written.
type asyncSave struct {
	step    int
	what    string
	blocked time.Duration // the loop's wait: the previous save, the snapshot (and, in sync mode, the write)
	stepS   float64       // the last step's duration, for the log
	async   bool
	start   time.Time
	done    chan struct{}
	err     error
	written time.Duration
}

// saveLast writes the checkpoint of the final step. With
// checkpoint.last_save_model_only it is model-only, except when the
// final step is also an interval step: then the full state is written
// (it contains the model), so that a run started again with more steps
// resumes from it exactly. A model-only save never replaces a full
// checkpoint of the same step (see save). With checkpoint.last_save_in_hf
// the model is also exported as a Hugging Face folder.
func (tr *Trainer) saveLast() error {
	ck := tr.Job.Checkpoint
	modelOnly := ck.LastSaveModelOnly
	if modelOnly && ck.Interval > 0 && tr.Step%ck.Interval == 0 {
		modelOnly = false
	}
	if err := tr.save(modelOnly, true); err != nil {
		return err
	}
	if ck.LastSaveInHF && !ck.LoadOnly && tr.dist.Rank == 0 {
		return tr.exportHF()
	}
	return nil
}

// HFDir is the Hugging Face folder checkpoint.last_save_in_hf writes for
// step's checkpoint: hf-step-<N> beside it.
func HFDir(ckptFolder string, step int) string {
	return filepath.Join(ckptFolder, fmt.Sprintf("hf-step-%d", step))
}

// exportHF writes the committed checkpoint of this step as a Hugging
// Face folder in checkpoint.export_dtype.
func (tr *Trainer) exportHF() error {
	m, err := modelfile.Load(checkpoint.StepDir(tr.ckptFolder, tr.Step))
	if err != nil {
		return fmt.Errorf("checkpoint.last_save_in_hf: %w", err)
	}
	out := HFDir(tr.ckptFolder, tr.Step)
	if err := hf.ExportModel(m, out, tr.Job.Checkpoint.ExportDtype, 0); err != nil {
		return fmt.Errorf("checkpoint.last_save_in_hf: %w", err)
	}
	tr.log.Printf("titan: exported step %d as a Hugging Face folder %s (%s)", tr.Step, out, tr.Job.Checkpoint.ExportDtype)
	return nil
}

// save writes a checkpoint of the current step, the model only or the
// full training state, and (rank 0) purges old ones; every rank calls
// it. A final save (the last step, an interruption) is always written
// before save returns; others run in the background under
// checkpoint.async_mode. With checkpoint.load_only nothing is saved.
//
// A model-only save of a step whose full checkpoint this run wrote or
// resumed from is skipped: the full one holds the model too, and
// replacing it would lose the state a run resumes from. (The decision
// is the same on every rank: it depends on no file.)
func (tr *Trainer) save(modelOnly, final bool) error {
	ck := tr.Job.Checkpoint
	if ck.LoadOnly {
		return nil
	}
	if modelOnly && tr.ck.lastFull == tr.Step {
		tr.logf("titan: %s holds the full state of step %d (the model included); the model-only save is skipped so that it stays resumable", checkpoint.StepDir(tr.ckptFolder, tr.Step), tr.Step)
		return tr.waitSave()
	}
	t0 := time.Now()
	if err := tr.waitSave(); err != nil {
		return err
	}
	write, err := tr.snapshot(modelOnly)
	if err != nil {
		return err
	}
	s := &asyncSave{step: tr.Step, what: "full state", stepS: tr.ck.stepS, start: time.Now(), done: make(chan struct{})}
	if modelOnly {
		s.what = "model only"
	}
	if !modelOnly {
		tr.ck.lastFull = tr.Step
	}
	s.async = ck.AsyncMode != "disabled" && !final
	if !s.async {
		s.err = write()
		s.written = time.Since(s.start)
		s.blocked = time.Since(t0)
		close(s.done)
		tr.ck.inflight = s
		return tr.waitSave()
	}
	s.blocked = time.Since(t0)
	go func() {
		s.err = write()
		s.written = time.Since(s.start)
		close(s.done)
	}()
	tr.ck.inflight = s
	return nil
}

// waitSave waits for the save in flight, if any, logs it and returns
// its error.
func (tr *Trainer) waitSave() error {
	s := tr.ck.inflight
	if s == nil {
		return nil
	}
	<-s.done
	return tr.finishSave(s)
}

// pollSave returns the error of a save in flight that has failed, and
// logs one that has finished; it does not wait.
func (tr *Trainer) pollSave() error {
	s := tr.ck.inflight
	if s == nil {
		return nil
	}
	select {
	case <-s.done:
		return tr.finishSave(s)
	default:
		return nil
	}
}

func (tr *Trainer) finishSave(s *asyncSave) error {
	tr.ck.inflight = nil
	dir := checkpoint.StepDir(tr.ckptFolder, s.step)
	if s.err != nil {
		return fmt.Errorf("checkpoint %s: %w", dir, s.err)
	}
	share := ""
	if s.stepS > 0 {
		share = fmt.Sprintf(" (%.1f%% of a step)", 100*s.blocked.Seconds()/s.stepS)
	}
	mode := ""
	if s.async {
		mode = " in the background"
	}
	tr.logf("titan: checkpoint %s (%s): loop blocked %.1f ms%s, written%s in %.0f ms", filepath.Base(dir), s.what, float64(s.blocked.Microseconds())/1e3, share, mode, float64(s.written.Microseconds())/1e3)
	return nil
}

// logf logs a line once the log is open (saves during set-up, such as
// the seed checkpoint, are before it).
func (tr *Trainer) logf(format string, args ...any) {
	if tr.log != nil {
		tr.log.Printf(format, args...)
	} else {
		fmt.Fprintf(tr.out, format+"\n", args...)
	}
}

// snapshot copies this rank's share of the state into host memory and
// returns the function that writes it (see the comment at the top).
func (tr *Trainer) snapshot(modelOnly bool) (func() error, error) {
	ck := tr.Job.Checkpoint
	bufs := []backend.Tensor{tr.eng.Params()}
	prefixes := []string{"model/"}
	if !modelOnly {
		bufs = append(bufs, tr.Opt.M, tr.Opt.V)
		prefixes = append(prefixes, "optimizer/exp_avg/", "optimizer/exp_avg_sq/")
	}
	// Rank 0's small state first: an error there leaves no host copy
	// to release.
	var blobs map[string][]byte
	if tr.dist.Rank == 0 {
		desc, err := modelfile.Describe(tr.fam, tr.Job.Model.Flavor)
		if err != nil {
			return nil, err
		}
		if blobs, err = modelfile.Blobs(desc, tr.Job.Model.TokenizerPath); err != nil {
			return nil, err
		}
		if !modelOnly {
			ts, _ := json.Marshal(trainState{Step: tr.Step, OptStep: tr.Opt.Step, Seed: tr.seed, Flavor: tr.Job.Model.Flavor, ElapsedS: tr.elapsedS(), GlobalBatch: tr.globalBatch()})
			blobs[checkpoint.TrainStateBlob] = ts
			ds, err := tr.Data.State()
			if err != nil {
				return nil, fmt.Errorf("checkpoint: data loader state: %w", err)
			}
			blobs["dataloader.json"] = ds
			if tr.Val != nil {
				vs, err := tr.Val.State()
				if err != nil {
					return nil, fmt.Errorf("checkpoint: validation loader state: %w", err)
				}
				blobs["val_dataloader.json"] = vs
			}
		}
	}
	var shards []checkpoint.Shard
	var frees []func()
	release := func() {
		for _, f := range frees {
			f()
		}
	}
	for i, b := range bufs {
		var h []float32
		if ck.AsyncMode == "async" {
			// Freed once written; outside the Go heap, whose fresh
			// pages cost a fault each (hostmem).
			var free func()
			h, free = hostmem.Float32s(b.Len)
			frees = append(frees, free)
		} else {
			if len(tr.ck.pinned[i]) != b.Len {
				tr.ck.pinned[i] = make([]float32, b.Len)
			}
			h = tr.ck.pinned[i]
		}
		tr.be.Download(h, b)
		shards = append(shards, tr.eng.Shards(h, prefixes[i])...)
	}
	folder, step, session, rank, world := tr.ckptFolder, tr.Step, tr.ck.session, tr.dist.Rank, tr.dist.World
	m := tr.mesh
	layout := checkpoint.Layout{World: world, PP: m.PP, DPReplicate: m.DPReplicate, DPShard: m.DPShard, CP: m.CP, TP: m.TP}
	timeout := 10 * time.Minute
	if s := tr.Job.Comm.TrainTimeoutSeconds; s > 0 {
		timeout = time.Duration(s) * time.Second
	}
	keep := ck.KeepLatestK
	return func() error {
		defer release() // the shards' host copies are written or abandoned
		p, err := checkpoint.Begin(folder, step, session, world)
		if err != nil {
			return err
		}
		if err := p.WritePart(rank, shards, blobs); err != nil {
			return err
		}
		if rank != 0 {
			return nil // rank 0 commits
		}
		if err := p.Commit(layout, timeout); err != nil {
			p.Abort()
			return err
		}
		return checkpoint.Purge(folder, keep)
	}, nil
}

// agreeSession gives every rank rank 0's session name (see
// checkpoint.NewSession), once, at start-up: the temporary folders of
// the job's saves are named after it.
func (tr *Trainer) agreeSession() error {
	s := checkpoint.NewSession()
	if tr.dist.World == 1 {
		tr.ck.session = s
		return nil
	}
	const words = 32
	buf := make([]int64, words)
	if tr.dist.Rank == 0 {
		if len(s) > 8*words {
			return fmt.Errorf("checkpoint: session name %q is too long", s)
		}
		b := make([]byte, 8*words)
		copy(b, s)
		for i := range buf {
			for j := 0; j < 8; j++ {
				buf[i] |= int64(b[8*i+j]) << (8 * j)
			}
		}
	}
	if err := tr.dist.Group.Broadcast(commCtx, comm.I64(buf), 0); err != nil {
		return fmt.Errorf("checkpoint: sharing the save session: %w", err)
	}
	b := make([]byte, 0, 8*words)
	for _, w := range buf {
		for j := 0; j < 8; j++ {
			b = append(b, byte(w>>(8*j)))
		}
	}
	tr.ck.session = strings.TrimRight(string(b), "\x00")
	return nil
}

// ResaveEnv names the environment variable that makes a run save the
// state it starts from (after loading a checkpoint) as a full checkpoint
// into the folder it names, before training: the resharding tests read
// it back to show that what a layout loaded is bit for bit what another
// saved.
const ResaveEnv = "TITAN_TEST_RESAVE"

// resave saves the current state into folder (see ResaveEnv).
func (tr *Trainer) resave(folder string) error {
	own, last := tr.ckptFolder, tr.ck.lastFull
	defer func() { tr.ckptFolder, tr.ck.lastFull = own, last }()
	tr.ckptFolder = folder
	return tr.save(false, true)
}
