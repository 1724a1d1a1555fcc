// Package train is titan's training loop: it wires the recipe's model,
// data, optimizer, schedule, metrics and checkpoints together and runs
// data → forward → loss → backward → clip → optimizer → schedule, step
// after step.
package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"time"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/backend/cpu/gemm"
	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/data"
	"github.com/titan-go/titan/internal/metrics"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/optim"
	"github.com/titan-go/titan/internal/tokenizer"
)

// Trainer holds one run's state.
type Trainer struct {
	Job   *config.Job
	Cfg   llama.Config
	Model *llama.Model
	Opt   *optim.AdamW
	Sched optim.Schedule
	Tok   tokenizer.Tokenizer
	Data  *data.Loader
	Val   *data.Loader
	Step  int // steps completed
	// OnStep, when set, is called after every optimizer step.
	OnStep func(step int, loss float64)

	be         backend.Backend
	accum      int
	log        *metrics.Logger
	out        io.Writer
	seed       uint64
	peakFLOPS  float64
	elapsed    float64 // seconds of training before this process (resumed runs)
	ckptFolder string
}

// Seed is the recipe's seed, or 0.
func seedOf(job *config.Job) uint64 {
	if job.Training.Seed != nil {
		return uint64(*job.Training.Seed)
	}
	return 0
}

// New builds a trainer from a validated recipe, resuming from the newest
// checkpoint in the dump folder when there is one.
func New(job *config.Job, out io.Writer) (*Trainer, error) {
	cfg, err := ModelConfig(job)
	if err != nil {
		return nil, err
	}
	tr := &Trainer{Job: job, Cfg: cfg, out: out, seed: seedOf(job)}
	tr.Tok, err = LoadTokenizer(job.Model.TokenizerPath)
	if err != nil {
		return nil, err
	}
	if tr.Tok.VocabSize() > cfg.VocabSize {
		return nil, fmt.Errorf("model.tokenizer_path %q: the %s tokenizer has %d tokens but model flavor %s has vocab_size %d", job.Model.TokenizerPath, tr.Tok.Name(), tr.Tok.VocabSize(), job.Model.Flavor, cfg.VocabSize)
	}
	T, B := job.Training.SeqLen, job.Training.LocalBatchSize
	tr.accum = 1
	if g := job.Training.GlobalBatchSize; g > 0 {
		if g%B != 0 {
			return nil, fmt.Errorf("training.global_batch_size %d is not a multiple of training.local_batch_size %d", g, B)
		}
		tr.accum = g / B
	} else if job.Training.GradientAccumulationSteps > 1 {
		tr.accum = job.Training.GradientAccumulationSteps
	}
	v := job.Validation
	heldOut := v.Enable && v.Dataset == "" && v.DatasetPath == ""
	tr.Data, err = OpenData(job.Training.Dataset, job.Training.DatasetPath, T, B*tr.accum, tr.seed, tr.Tok, heldOut, false)
	if err != nil {
		return nil, fmt.Errorf("training dataset: %w", err)
	}
	if job.Validation.Enable {
		ds, path := v.Dataset, v.DatasetPath
		if heldOut {
			ds, path = job.Training.Dataset, job.Training.DatasetPath
		}
		if tr.Val, err = OpenData(ds, path, T, B, tr.seed, tr.Tok, heldOut, heldOut); err != nil {
			return nil, fmt.Errorf("validation dataset: %w", err)
		}
	}
	be := cpu.New(job.Training.Threads)
	tr.be = be
	tr.Model, err = llama.New(be, cfg, B, T, llama.Options{})
	if err != nil {
		return nil, err
	}
	oc := job.Optimizer
	tr.Opt = optim.NewAdamW(be, tr.Model.Params.Len, optim.AdamWConfig{
		LR: float32(oc.LR), Beta1: float32(oc.Beta1), Beta2: float32(oc.Beta2), Eps: float32(oc.Eps), WeightDecay: float32(oc.WeightDecay),
	})
	ls := job.LRScheduler
	tr.Sched = optim.Schedule{PeakLR: oc.LR, Warmup: ls.WarmupSteps, Total: job.Training.Steps, DecayRatio: -1, DecayType: ls.DecayType, MinLRFactor: ls.MinLRFactor}
	if ls.TotalSteps != nil {
		tr.Sched.Total = *ls.TotalSteps
	}
	if ls.DecayRatio != nil {
		tr.Sched.DecayRatio = *ls.DecayRatio
	}
	if err := tr.Sched.Validate(); err != nil {
		return nil, err
	}
	if p, ok := tr.be.(interface{ PeakFLOPS() float64 }); ok {
		tr.peakFLOPS = p.PeakFLOPS()
	}
	tr.ckptFolder = filepath.Join(job.Job.DumpFolder, job.Checkpoint.Folder)
	tr.Model.Init(tr.seed)
	if err := tr.restore(); err != nil {
		return nil, err
	}
	return tr, nil
}

// ModelConfig resolves the recipe's model and checks that the recipe's
// shapes fit it.
func ModelConfig(job *config.Job) (llama.Config, error) {
	if job.Model.Name != "llama3" {
		return llama.Config{}, fmt.Errorf("model.name %q: titan trains llama3 models", job.Model.Name)
	}
	cfg, err := llama.Flavor(job.Model.Flavor)
	if err != nil {
		return llama.Config{}, fmt.Errorf("model.flavor: %w", err)
	}
	if T := job.Training.SeqLen; T > cfg.MaxSeqLen {
		return llama.Config{}, fmt.Errorf("training.seq_len %d exceeds the max_seq_len %d of flavor %s", T, cfg.MaxSeqLen, job.Model.Flavor)
	}
	return cfg, nil
}

// Close releases the backend.
func (tr *Trainer) Close() {
	if c, ok := tr.be.(interface{ Close() }); ok {
		c.Close()
	}
}

// Run trains until training.steps or until ctx is cancelled (Ctrl-C), in
// which case it saves a checkpoint and returns ctx's error.
func (tr *Trainer) Run(ctx context.Context) error {
	job := tr.Job
	var err error
	tr.log, err = metrics.Open(job.Job.DumpFolder, tr.out, job.Training.Steps)
	if err != nil {
		return err
	}
	defer tr.log.Close()
	B, T := tr.Model.B, tr.Model.T
	tr.log.Printf("titan: llama3 %s, %s parameters, %d sequences × %d tokens per step (%d microbatches), %d threads, gemm %s, peak %.0f GFLOP/s",
		job.Model.Flavor, humanCount(tr.Cfg.NumParams()), tr.accum*B, T, tr.accum, tr.be.(*cpu.Backend).Threads(), gemm.Kernel(), tr.peakFLOPS/1e9)
	if tr.Step > 0 {
		tr.log.Printf("titan: resumed from %s at step %d", checkpointDir(tr.ckptFolder, tr.Step), tr.Step)
	}
	if tr.Step >= job.Training.Steps {
		tr.log.Printf("titan: already trained %d of %d steps; nothing to do", tr.Step, job.Training.Steps)
		return nil
	}
	flopsPerToken := tr.Cfg.FLOPsPerToken(T)
	logFreq := max(1, job.Metrics.LogFreq)
	start := time.Now()
	windowStart, windowTokens := time.Now(), 0
	var lossSum float64
	var lossN int
	for tr.Step < job.Training.Steps {
		if ctx.Err() != nil {
			tr.log.Printf("titan: interrupted after step %d; saving a checkpoint", tr.Step)
			if err := tr.save(false); err != nil {
				return err
			}
			return ctx.Err()
		}
		loss, gnorm, lr, err := tr.TrainStep()
		if err != nil {
			return fmt.Errorf("step %d: %w", tr.Step+1, err)
		}
		if math.IsNaN(loss) || math.IsInf(loss, 0) {
			return fmt.Errorf("step %d: loss is %v", tr.Step, loss)
		}
		if tr.OnStep != nil {
			tr.OnStep(tr.Step, loss)
		}
		windowTokens += tr.accum * B * T
		lossSum += loss
		lossN++
		tr.log.Progress(tr.Step, loss)
		var val *float64
		if tr.Val != nil && job.Validation.Freq > 0 && tr.Step%job.Validation.Freq == 0 {
			v, err := tr.Validate(job.Validation.Steps)
			if err != nil {
				return err
			}
			val = &v
		}
		if tr.Step%logFreq == 0 || tr.Step == 1 || tr.Step == job.Training.Steps || val != nil {
			sec := time.Since(windowStart).Seconds()
			tps := float64(windowTokens) / sec
			rec := metrics.Record{
				Step: tr.Step, Loss: lossSum / float64(lossN), GradNorm: gnorm, LR: lr,
				TokensPerSec: tps, TFLOPs: flopsPerToken * tps / 1e12, MemGiB: metrics.PeakRSSGiB(),
				ElapsedS: tr.elapsed + time.Since(start).Seconds(), ValLoss: val,
			}
			if tr.peakFLOPS > 0 {
				rec.MFU = 100 * flopsPerToken * tps / tr.peakFLOPS
			}
			if err := tr.log.Log(rec); err != nil {
				return err
			}
			windowStart, windowTokens, lossSum, lossN = time.Now(), 0, 0, 0
		}
		ck := job.Checkpoint
		if ck.Enable && tr.Step < job.Training.Steps && ck.Interval > 0 && tr.Step%ck.Interval == 0 {
			if err := tr.save(false); err != nil {
				return err
			}
		}
	}
	tr.elapsed += time.Since(start).Seconds()
	if job.Checkpoint.Enable {
		return tr.save(job.Checkpoint.LastSaveModelOnly)
	}
	return nil
}

// TrainStep runs one optimizer step over the global batch (accumulating
// gradients over microbatches) and returns the mean loss, the gradient
// norm before clipping and the learning rate used.
func (tr *Trainer) TrainStep() (loss, gradNorm, lr float64, err error) {
	m := tr.Model
	batch, err := tr.Data.Next()
	if err != nil {
		return 0, 0, 0, err
	}
	targets := 0
	for _, l := range batch.Labels {
		if l >= 0 {
			targets++
		}
	}
	if targets == 0 {
		return 0, 0, 0, errors.New("the batch has no targets")
	}
	m.ZeroGrad()
	var lossSum float64
	n := m.B * m.T
	for a := 0; a < tr.accum; a++ {
		in, lab := batch.Inputs[a*n:(a+1)*n], batch.Labels[a*n:(a+1)*n]
		l, err := m.Forward(in, lab)
		if err != nil {
			return 0, 0, 0, err
		}
		lossSum += float64(l) * float64(m.NumTargets())
		if err := m.Backward(1 / float32(targets)); err != nil {
			return 0, 0, 0, err
		}
	}
	norm, scale := optim.ClipScale(tr.be.SumSquares(m.Grads), float32(tr.Job.Training.MaxNorm))
	lr = tr.Sched.LR(tr.Step)
	if err := tr.Opt.Update(m.Params, m.Grads, float32(lr), scale); err != nil {
		return 0, 0, 0, err
	}
	tr.Step++
	return lossSum / float64(targets), norm, lr, nil
}

// Validate returns the mean loss over steps batches of the validation
// set (steps <= 0: 10 batches).
func (tr *Trainer) Validate(steps int) (float64, error) {
	if steps <= 0 {
		steps = 10
	}
	var sum float64
	var n int
	for i := 0; i < steps; i++ {
		b, err := tr.Val.Next()
		if err != nil {
			return 0, fmt.Errorf("validation: %w", err)
		}
		rows := tr.Model.B * tr.Model.T
		for off := 0; off+rows <= len(b.Inputs); off += rows {
			l, err := tr.Model.Forward(b.Inputs[off:off+rows], b.Labels[off:off+rows])
			if err != nil {
				return 0, err
			}
			sum += float64(l) * float64(tr.Model.NumTargets())
			n += tr.Model.NumTargets()
		}
	}
	return sum / float64(max(n, 1)), nil
}

func humanCount(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	}
	return fmt.Sprintf("%d", n)
}
