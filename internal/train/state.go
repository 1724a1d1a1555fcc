package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/titan-go/titan/internal/data"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/hf"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/modelfile"
)

// trainState is the train_state blob of a checkpoint.
type trainState struct {
	Step     int     `json:"step"`
	OptStep  int     `json:"optimizer_step"`
	Seed     uint64  `json:"seed"`
	Flavor   string  `json:"flavor"`
	ElapsedS float64 `json:"elapsed_s"`
	// GlobalBatch is the sequences of a step (0 in checkpoints from
	// before 2026-12-07).
	GlobalBatch int `json:"global_batch,omitempty"`
}

func checkpointDir(folder string, step int) string { return checkpoint.StepDir(folder, step) }

// ckptState is the trainer's checkpoint bookkeeping: the dump folder's
// lock, what the restore found (to be logged once the log is open) and
// the saves (save.go).
type ckptState struct {
	lock  *checkpoint.Lock
	notes []string
	// session names the job's saves (rank 0's, shared at start-up).
	session string
	// lastFull is the step of the newest full checkpoint this run saved
	// or resumed from (-1: none).
	lastFull int
	// inflight is the save being written in the background (nil: none).
	inflight *asyncSave
	// pinned are the snapshot buffers async_with_pinned_mem reuses.
	pinned [3][]float32
	// stepS is the duration of the last training step, the measure of
	// a save's blocking.
	stepS float64
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
	if ck.CreateSeedCheckpoint {
		// The seed is the initial weights: nothing is loaded, and a
		// folder that holds checkpoints already is refused (see
		// createSeed).
		if len(infos)+len(problems) > 0 {
			return fmt.Errorf("checkpoint.create_seed_checkpoint: %s already holds checkpoints; a seed checkpoint starts an empty folder", tr.ckptFolder)
		}
		return nil
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
		if err := tr.loadAgreed(in.Dir, tr.loadFull); err != nil {
			return fmt.Errorf("checkpoint.load_step %d: %w", ck.LoadStep, err)
		}
		return nil
	}
	var newerModelOnly, unloadable []string
	for i := len(infos) - 1; i >= 0; i-- {
		in := infos[i]
		if !in.Meta.Full() {
			newerModelOnly = append(newerModelOnly, filepath.Base(in.Dir))
			continue
		}
		if err := tr.loadAgreed(in.Dir, tr.loadFull); err != nil {
			if errors.Is(err, errCollective) || errors.Is(err, errIncompatible) {
				return err
			}
			tr.note("titan: warning: skipping checkpoint %s: %v", in.Dir, err)
			unloadable = append(unloadable, fmt.Sprintf("%s: %v", in.Dir, err))
			continue
		}
		if len(newerModelOnly) > 0 {
			tr.note("titan: %s model-only (no training state); resuming from the full state of %s", strings.Join(newerModelOnly, ", ")+isAre(len(newerModelOnly)), in.Dir)
		}
		return nil
	}
	if len(infos) == 1 && infos[0].Step == 0 && !infos[0].Meta.Full() && len(problems) == 0 {
		// A seed checkpoint (checkpoint.create_seed_checkpoint) alone:
		// the run's initial weights, as torchtitan starts from it.
		dir := infos[0].Dir
		if err := tr.loadAgreed(dir, func(r *checkpoint.Reader) error { return tr.loadModelOnly(r, 0) }); err != nil {
			return fmt.Errorf("checkpoint: seed checkpoint %s: %w", dir, err)
		}
		tr.note("titan: initial weights from the seed checkpoint %s (model-only, step 0)", dir)
		return nil
	}
	if ck.InitialLoadPath != "" {
		return tr.initialLoad()
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
	tr.note("titan: no checkpoint in %s: training from step 1", tr.ckptFolder)
	return nil
}

// initialLoad starts the run from checkpoint.initial_load_path: a titan
// checkpoint's weights (initial_load_model_only, the default) or its full
// state, or a Hugging Face folder's weights (initial_load_in_hf).
func (tr *Trainer) initialLoad() error {
	ck := tr.Job.Checkpoint
	if ck.InitialLoadInHF {
		r, err := tr.hfReader(ck.InitialLoadPath)
		if err != nil {
			return fmt.Errorf("checkpoint.initial_load_path (initial_load_in_hf): %w", err)
		}
		if err := tr.loadModelOnly(r, 0); err != nil {
			return fmt.Errorf("checkpoint.initial_load_path (initial_load_in_hf): %w", err)
		}
		tr.note("titan: initial weights from the Hugging Face folder %s (checkpoint.initial_load_in_hf: step, optimizer and data loader start fresh)", ck.InitialLoadPath)
		return nil
	}
	dir, err := modelfile.Resolve(ck.InitialLoadPath)
	if err != nil {
		return fmt.Errorf("checkpoint.initial_load_path: %w", err)
	}
	var meta checkpoint.Metadata
	load := func(r *checkpoint.Reader) error {
		meta = r.Meta
		if ck.InitialLoadModelOnly {
			return tr.loadModelOnly(r, 0)
		}
		if !r.Meta.Full() {
			r.Close()
			return fmt.Errorf("%s is a model-only checkpoint, and checkpoint.initial_load_model_only = false asks for its full training state; set initial_load_model_only = true to start from its weights", dir)
		}
		return tr.loadFull(r)
	}
	if err := tr.loadAgreed(dir, load); err != nil {
		return fmt.Errorf("checkpoint.initial_load_path: %w", err)
	}
	if !ck.InitialLoadModelOnly {
		tr.note("titan: started from the full state of %s (checkpoint.initial_load_model_only = false: model, optimizer, data loader and step %d)", dir, tr.Step)
		return nil
	}
	tr.note("titan: initial weights from %s (%s checkpoint of step %d, loaded model-only as checkpoint.initial_load_path asks: step, optimizer and data loader start fresh)", dir, meta.Kind(), meta.Step)
	return nil
}

// hfReader imports the Hugging Face Llama folder dir and returns its
// weights as a reader of whole tensors, which every layout loads its
// ranges from.
func (tr *Trainer) hfReader(dir string) (*checkpoint.Reader, error) {
	if tr.Job.Model.Name != "llama3" {
		return nil, fmt.Errorf("Hugging Face folders hold llama3 models; the recipe's model is %s", tr.Job.Model.Name)
	}
	cfg, params, err := hf.Import(dir)
	if err != nil {
		return nil, err
	}
	return checkpoint.MemReader(dir, modelfile.Shards(llama.Family{Cfg: cfg}.Tensors(), params))
}

// createSeed writes the seed checkpoint (checkpoint.create_seed_checkpoint):
// the initial weights as the model-only checkpoint of step 0, on one
// process as torchtitan requires, and ends the run. Runs that start from
// the folder then load it, whatever their layout, so that they start
// from identical weights.
func (tr *Trainer) createSeed() error {
	if tr.dist.World != 1 {
		return fmt.Errorf("checkpoint.create_seed_checkpoint: run it on one process (this job has %d); every layout then loads the seed", tr.dist.World)
	}
	tr.Step = 0
	if err := tr.save(true, true); err != nil {
		return err
	}
	tr.log.Printf("titan: created the seed checkpoint %s (model-only, step 0); start the training runs from this checkpoint folder", checkpoint.StepDir(tr.ckptFolder, 0))
	return nil
}

// isAre is " is" or " are", after a list of n names.
func isAre(n int) string {
	if n == 1 {
		return " is"
	}
	return " are"
}

// errCollective marks a failure of the ranks' agreement itself (a lost
// rank), which ends the restore instead of passing to an older
// checkpoint.
var errCollective = errors.New("the ranks could not agree on the checkpoint")

// errIncompatible marks a checkpoint that is intact but of another model
// than the recipe's: an error, not a reason to resume from an older one.
var errIncompatible = errors.New("incompatible checkpoint")

// loadAgreed opens the checkpoint in dir and loads it with load on every
// rank. A rank reads only the chunks that hold its ranges (its shards of
// the model and optimizer state, the small states), verifying each
// chunk's checksum as it reads it, so no rank reads the whole checkpoint.
// The ranks then agree (one all-reduce) that every one of them loaded it;
// if any could not (a corrupt or missing chunk only some read), every rank
// reports the checkpoint unloadable and the caller passes to an older
// one, which overwrites all that was loaded. A failing rank other than 0
// prints its reason itself; rank 0's error counts them.
func (tr *Trainer) loadAgreed(dir string, load func(*checkpoint.Reader) error) error {
	r, err := checkpoint.Open(dir)
	if err == nil {
		err = load(r) // closes r
	}
	failed := []int64{0}
	if err != nil {
		failed[0] = 1
	}
	if tr.dist.World > 1 {
		if aerr := tr.dist.Group.AllReduce(commCtx, comm.I64(failed), comm.Sum); aerr != nil {
			return fmt.Errorf("%w: %v", errCollective, aerr)
		}
	}
	switch {
	case err != nil && tr.dist.Rank != 0:
		fmt.Fprintf(os.Stderr, "titan: rank %d: cannot load checkpoint %s: %v\n", tr.dist.Rank, dir, err)
		return err
	case err != nil && failed[0] > 1:
		return fmt.Errorf("%w (and %d other ranks could not load it either)", err, failed[0]-1)
	case err != nil:
		return err
	case failed[0] > 0:
		return fmt.Errorf("%d of %d ranks could not load %s (each names its reason in its own output)", failed[0], tr.dist.World, dir)
	}
	return nil
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
	defer r.Close()
	if err := tr.loadTensor(r, "model/", tr.paramsTensor()); err != nil {
		return err
	}
	tr.Step = step
	return nil
}

func (tr *Trainer) loadFull(r *checkpoint.Reader) error {
	defer r.Close()
	raw, err := r.Blob(checkpoint.TrainStateBlob)
	if err != nil {
		return err
	}
	var ts trainState
	if err := json.Unmarshal(raw, &ts); err != nil {
		return fmt.Errorf("checkpoint %s: train_state.json: %w", r.Dir, err)
	}
	if ts.Flavor != tr.Job.Model.Flavor {
		return fmt.Errorf("%w: checkpoint %s holds a %s model, the recipe asks for %s", errIncompatible, r.Dir, ts.Flavor, tr.Job.Model.Flavor)
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
			var other *data.OtherDataError
			if errors.As(err, &other) {
				return fmt.Errorf("%w: checkpoint %s is intact, but the recipe's data differ from those of the run that saved it (%s): set training.dataset, dataset_path, seq_len, seed, model.tokenizer_path and validation.enable (validation without a dataset of its own holds part of the training data out) as they were to resume, or choose another job.dump_folder", errIncompatible, r.Dir, other.Msg)
			}
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
		tr.ck.lastFull = tr.Step
	}
	if now := tr.globalBatch(); ts.GlobalBatch > 0 && ts.GlobalBatch != now {
		tr.note("titan: warning: checkpoint %s was saved by a run of %d sequences a step; this one takes %d (training.local_batch_size %d × %d data ranks × %d accumulated), so training goes on with another batch: set training.global_batch_size = %d to keep the saved one on any layout",
			r.Dir, ts.GlobalBatch, now, tr.Job.Training.LocalBatchSize, tr.dataRanks(), tr.accum, ts.GlobalBatch)
	}
	if slices.Contains(exclude, "lr_scheduler") {
		// The schedule starts again from its first step.
		tr.schedStart = tr.Step
	}
	return nil
}
