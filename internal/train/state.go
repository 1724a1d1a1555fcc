package train

import (
	"encoding/json"
	"fmt"
	"slices"

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

// save writes a checkpoint of the current step (model only, or the full
// training state) and purges old ones. Every rank calls it: under FSDP
// the shards are first all-gathered (every rank of a shard group then
// holds the whole state, transiently), and rank 0 writes the whole
// tensors as a one-process run does. Sharded parallel writes are future
// work.
func (tr *Trainer) save(modelOnly bool) error {
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
		blobs["train_state.json"] = ts
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
		what := "checkpoint"
		if modelOnly {
			what = "model-only checkpoint"
		}
		tr.log.Printf("titan: saved %s %s", what, checkpoint.StepDir(tr.ckptFolder, tr.Step))
	}
	return checkpoint.Purge(tr.ckptFolder, tr.Job.Checkpoint.KeepLatestK)
}

// restore loads the newest full checkpoint in the dump folder (or
// checkpoint.load_step), as torchtitan resumes a job on its own; without
// one it loads checkpoint.initial_load_path when set.
func (tr *Trainer) restore() error {
	ck := tr.Job.Checkpoint
	if !ck.Enable {
		return nil
	}
	steps, err := checkpoint.Steps(tr.ckptFolder)
	if err != nil {
		return err
	}
	if ck.LoadStep >= 0 {
		if !slices.Contains(steps, ck.LoadStep) {
			return fmt.Errorf("checkpoint.load_step %d: no checkpoint of that step in %s (have %v)", ck.LoadStep, tr.ckptFolder, steps)
		}
		steps = []int{ck.LoadStep}
	}
	for i := len(steps) - 1; i >= 0; i-- {
		dir := checkpoint.StepDir(tr.ckptFolder, steps[i])
		r, err := checkpoint.Open(dir)
		if err != nil {
			return err
		}
		if _, ok := r.Meta.Blobs["train_state.json"]; !ok {
			if i == len(steps)-1 && ck.LoadStep < 0 {
				// The final model-only save of a finished run.
				return tr.loadModelOnly(r, steps[i])
			}
			continue
		}
		return tr.loadFull(r)
	}
	if ck.InitialLoadPath != "" {
		r, err := checkpoint.Open(ck.InitialLoadPath)
		if err != nil {
			return fmt.Errorf("checkpoint.initial_load_path: %w", err)
		}
		return tr.loadModelOnly(r, 0)
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
	if err := tr.loadTensor(r, "model/", tr.paramsTensor()); err != nil {
		return err
	}
	tr.Step = step
	return nil
}

func (tr *Trainer) loadFull(r *checkpoint.Reader) error {
	raw, err := r.Blob("train_state.json")
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
