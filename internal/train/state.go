package train

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/modelfile"
)

// trainState is the train_state blob of a checkpoint.
type trainState struct {
	Step     int     `json:"step"`
	OptStep  int     `json:"optimizer_step"`
	Seed     uint64  `json:"seed"`
	Flavor   string  `json:"flavor"`
	ElapsedS float64 `json:"elapsed_s"`
}

func checkpointDir(folder string, step int) string { return checkpoint.StepDir(folder, step) }

// fullState returns the whole flat parameters and, unless modelOnly, the
// optimizer moments. Under sharded data parallelism it all-gathers them
// over the shard group, so every rank must call it.
func (tr *Trainer) fullState(modelOnly bool) (params, mv, vv []float32, err error) {
	e := tr.eng
	if params, err = e.GatherFull(e.Params()); err != nil || modelOnly {
		return params, nil, nil, err
	}
	if mv, err = e.GatherFull(tr.Opt.M); err != nil {
		return nil, nil, nil, err
	}
	vv, err = e.GatherFull(tr.Opt.V)
	return params, mv, vv, err
}

// ckptState is the trainer's checkpoint bookkeeping: the dump folder's
// lock and what the restore found, to be logged once the log is open.
type ckptState struct {
	lock  *checkpoint.Lock
	notes []string
}

// note records a line for the run's log (restore runs before it opens).
func (tr *Trainer) note(format string, args ...any) {
	tr.ck.notes = append(tr.ck.notes, fmt.Sprintf(format, args...))
}

// logNotes prints the restore's notes into the run's log.
func (tr *Trainer) logNotes() {
	for _, n := range tr.ck.notes {
		tr.log.Printf("%s", n)
	}
	tr.ck.notes = nil
}

// unlock releases the dump folder.
func (tr *Trainer) unlock() {
	tr.ck.lock.Release()
	tr.ck.lock = nil
}

// saveLast writes the checkpoint of the final step. With
// checkpoint.last_save_model_only it is model-only, except when the
// final step is also an interval step: then the full state is written
// (it contains the model), so that a run started again with more steps
// resumes from it exactly. A model-only save never replaces a full
// checkpoint of the same step (see save).
func (tr *Trainer) saveLast() error {
	ck := tr.Job.Checkpoint
	modelOnly := ck.LastSaveModelOnly
	if modelOnly && ck.Interval > 0 && tr.Step%ck.Interval == 0 {
		modelOnly = false
	}
	return tr.save(modelOnly)
}

// save writes a checkpoint of the current step (model only, or the full
// training state) and purges old ones. Every rank calls it: under FSDP
// the shards are first all-gathered (every rank of a shard group then
// holds the whole state, transiently), and rank 0 writes the whole
// tensors as a one-process run does. Sharded parallel writes are future
// work.
//
// A model-only save of a step whose full checkpoint exists is skipped:
// the full one holds the model too, and replacing it would lose the
// state a run resumes from.
func (tr *Trainer) save(modelOnly bool) error {
	if modelOnly {
		if r, err := checkpoint.Open(checkpoint.StepDir(tr.ckptFolder, tr.Step)); err == nil && r.Meta.Full() {
			if tr.log != nil {
				tr.log.Printf("titan: %s holds the full state of step %d (the model included); the model-only save is skipped so that it stays resumable", r.Dir, tr.Step)
			}
			return nil
		}
	}
	params, mv, vv, err := tr.fullState(modelOnly)
	if err != nil {
		return fmt.Errorf("checkpoint: gathering the state: %w", err)
	}
	if tr.dist.Rank != 0 {
		return nil // rank 0 writes the state every replica holds
	}
	shards := modelfile.Shards(tr.fam.Tensors(), params)
	desc, err := modelfile.Describe(tr.fam, tr.Job.Model.Flavor)
	if err != nil {
		return err
	}
	blobs, err := modelfile.Blobs(desc, tr.Job.Model.TokenizerPath)
	if err != nil {
		return err
	}
	if !modelOnly {
		shards = append(shards, modelfile.PrefixedShards("optimizer/exp_avg/", tr.fam.Tensors(), mv)...)
		shards = append(shards, modelfile.PrefixedShards("optimizer/exp_avg_sq/", tr.fam.Tensors(), vv)...)
		ts, _ := json.Marshal(trainState{Step: tr.Step, OptStep: tr.Opt.Step, Seed: tr.seed, Flavor: tr.Job.Model.Flavor, ElapsedS: tr.elapsed})
		blobs[checkpoint.TrainStateBlob] = ts
		ds, err := tr.Data.State()
		if err != nil {
			return fmt.Errorf("checkpoint: data loader state: %w", err)
		}
		blobs["dataloader.json"] = ds
		if tr.Val != nil {
			vs, err := tr.Val.State()
			if err != nil {
				return fmt.Errorf("checkpoint: validation loader state: %w", err)
			}
			blobs["val_dataloader.json"] = vs
		}
	}
	if err := checkpoint.Save(tr.ckptFolder, tr.Step, shards, blobs); err != nil {
		return err
	}
	if tr.log != nil {
		what := "checkpoint (full state)"
		if modelOnly {
			what = "model-only checkpoint"
		}
		tr.log.Printf("titan: saved %s %s", what, checkpoint.StepDir(tr.ckptFolder, tr.Step))
	}
	return checkpoint.Purge(tr.ckptFolder, tr.Job.Checkpoint.KeepLatestK)
}

// restore takes the dump folder's lock (rank 0, when checkpoints are
// on: two runs saving into one folder would overwrite and purge each
// other's checkpoints) and loads the newest
// full checkpoint in the checkpoint folder (or checkpoint.load_step), as
// torchtitan resumes a job on its own; without one it loads
// checkpoint.initial_load_path when set.
//
// Nothing is skipped silently: step folders that are incomplete or
// corrupt are named in a warning with the reason and passed over when an
// older intact full checkpoint remains (and are an error naming them
// when none does: training from step 1 would discard them), as are
// newer model-only checkpoints (the final saves of finished runs); a
// folder holding only model-only checkpoints is an error unless
// checkpoint.initial_load_path names one, because resuming from weights
// alone (a fresh optimizer, the data from its start) is not a resume.
// checkpoint.load_step must name a full, intact checkpoint.
func (tr *Trainer) restore() (err error) {
	ck := tr.Job.Checkpoint
	if !ck.Enable {
		return nil
	}
	if tr.dist.Rank == 0 {
		if tr.ck.lock, err = checkpoint.Acquire(tr.Job.Job.DumpFolder); err != nil {
			return fmt.Errorf("job.dump_folder: %w", err)
		}
		defer func() {
			if err != nil {
				tr.unlock()
			}
		}()
	}
	infos, problems, err := checkpoint.Scan(tr.ckptFolder)
	if err != nil {
		return err
	}
	for _, p := range problems {
		if ck.LoadStep >= 0 && p.Step == ck.LoadStep {
			return fmt.Errorf("checkpoint.load_step %d: %s cannot be loaded: %w", ck.LoadStep, p.Dir, p.Err)
		}
		tr.note("titan: warning: skipping checkpoint %s: %v", p.Dir, p.Err)
	}
	if ck.LoadStep >= 0 {
		i := slices.IndexFunc(infos, func(in checkpoint.Info) bool { return in.Step == ck.LoadStep })
		if i < 0 {
			have := make([]int, len(infos))
			for j, in := range infos {
				have[j] = in.Step
			}
			return fmt.Errorf("checkpoint.load_step %d: no checkpoint of that step in %s (have %v)", ck.LoadStep, tr.ckptFolder, have)
		}
		in := infos[i]
		if !in.Meta.Full() {
			return fmt.Errorf("checkpoint.load_step %d: %s is a model-only checkpoint (no optimizer, data loader or step to resume); to start from its weights set checkpoint.initial_load_path=%s and leave load_step at -1", ck.LoadStep, in.Dir, in.Dir)
		}
		r, err := openVerified(in.Dir)
		if err != nil {
			return fmt.Errorf("checkpoint.load_step %d: %w", ck.LoadStep, err)
		}
		return tr.loadFull(r)
	}
	var newerModelOnly, unloadable []string
	for i := len(infos) - 1; i >= 0; i-- {
		in := infos[i]
		if !in.Meta.Full() {
			newerModelOnly = append(newerModelOnly, filepath.Base(in.Dir))
			continue
		}
		r, err := openVerified(in.Dir)
		if err != nil {
			tr.note("titan: warning: skipping checkpoint %s: %v", in.Dir, err)
			unloadable = append(unloadable, fmt.Sprintf("%s: %v", in.Dir, err))
			continue
		}
		if len(newerModelOnly) > 0 {
			tr.note("titan: %s model-only (no training state); resuming from the full state of %s", strings.Join(newerModelOnly, ", ")+isAre(len(newerModelOnly)), in.Dir)
		}
		return tr.loadFull(r)
	}
	if ck.InitialLoadPath != "" {
		dir, err := modelfile.Resolve(ck.InitialLoadPath)
		if err != nil {
			return fmt.Errorf("checkpoint.initial_load_path: %w", err)
		}
		r, err := openVerified(dir)
		if err != nil {
			return fmt.Errorf("checkpoint.initial_load_path: %w", err)
		}
		if err := tr.loadModelOnly(r, 0); err != nil {
			return fmt.Errorf("checkpoint.initial_load_path: %w", err)
		}
		tr.note("titan: initial weights from %s (%s checkpoint of step %d, loaded model-only as checkpoint.initial_load_path asks: step, optimizer and data loader start fresh)", dir, r.Meta.Kind(), r.Meta.Step)
		return nil
	}
	if len(newerModelOnly) > 0 {
		return fmt.Errorf("checkpoint: %s holds only model-only checkpoints (%s), no training state to resume; to train on from those weights set checkpoint.initial_load_path=%s (a fresh optimizer and data loader), or choose another job.dump_folder", tr.ckptFolder, strings.Join(newerModelOnly, ", "), infos[len(infos)-1].Dir)
	}
	if len(problems) > 0 || len(unloadable) > 0 {
		var why []string
		for _, p := range problems {
			why = append(why, p.Error())
		}
		why = append(why, unloadable...)
		return fmt.Errorf("checkpoint: %s holds no intact checkpoint to resume from, only damaged ones: %s; starting again from step 1 would discard them, so move them away (or choose another job.dump_folder) to train from scratch", tr.ckptFolder, strings.Join(why, "; "))
	}
	return nil
}

// isAre is " is" or " are", after a list of n names.
func isAre(n int) string {
	if n == 1 {
		return " is"
	}
	return " are"
}

// openVerified opens the checkpoint in dir and checks every checksum
// before anything of it is loaded.
func openVerified(dir string) (*checkpoint.Reader, error) {
	r, err := checkpoint.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := r.Verify(); err != nil {
		return nil, err
	}
	return r, nil
}

// loadTensor reads the tensors prefix+<parameter> into dst, a flat
// buffer (the model's parameters or an optimizer moment) or, under FSDP,
// this rank's shards of one, read range by range.
func (tr *Trainer) loadTensor(r *checkpoint.Reader, prefix string, dst backend.Tensor) error {
	if err := tr.eng.Load(r, prefix, dst); err != nil {
		return err
	}
	tr.eng.Updated()
	return nil
}

// paramsTensor is the buffer that holds this rank's parameters.
func (tr *Trainer) paramsTensor() backend.Tensor {
	return tr.eng.Params()
}

func (tr *Trainer) loadModelOnly(r *checkpoint.Reader, step int) error {
	if err := tr.loadTensor(r, "model/", tr.paramsTensor()); err != nil {
		return err
	}
	tr.Step = step
	return nil
}

func (tr *Trainer) loadFull(r *checkpoint.Reader) error {
	raw, err := r.Blob(checkpoint.TrainStateBlob)
	if err != nil {
		return err
	}
	var ts trainState
	if err := json.Unmarshal(raw, &ts); err != nil {
		return fmt.Errorf("checkpoint %s: train_state.json: %w", r.Dir, err)
	}
	if ts.Flavor != tr.Job.Model.Flavor {
		return fmt.Errorf("checkpoint %s holds a %s model, the recipe asks for %s", r.Dir, ts.Flavor, tr.Job.Model.Flavor)
	}
	exclude := tr.Job.Checkpoint.ExcludeFromLoading
	if !slices.Contains(exclude, "optimizer") {
		if err := tr.loadTensor(r, "optimizer/exp_avg/", tr.Opt.M); err != nil {
			return err
		}
		if err := tr.loadTensor(r, "optimizer/exp_avg_sq/", tr.Opt.V); err != nil {
			return err
		}
		tr.Opt.Step = ts.OptStep
	}
	if !slices.Contains(exclude, "dataloader") {
		ds, err := r.Blob("dataloader.json")
		if err != nil {
			return err
		}
		if err := tr.Data.Restore(ds); err != nil {
			return fmt.Errorf("checkpoint %s: data loader: %w", r.Dir, err)
		}
		if tr.Val != nil {
			if vs, err := r.Blob("val_dataloader.json"); err == nil {
				if err := tr.Val.Restore(vs); err != nil {
					return fmt.Errorf("checkpoint %s: validation loader: %w", r.Dir, err)
				}
			}
		}
	}
	if !slices.Contains(exclude, "model") {
		if err := tr.loadTensor(r, "model/", tr.paramsTensor()); err != nil {
			return err
		}
	}
	if !slices.Contains(exclude, "train_state") {
		tr.Step, tr.seed, tr.elapsed = ts.Step, ts.Seed, ts.ElapsedS
	}
	if slices.Contains(exclude, "lr_scheduler") {
		// The schedule starts again from its first step.
		tr.schedStart = tr.Step
	}
	return nil
}
