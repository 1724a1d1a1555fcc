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
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/bytesize"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/data"
	"github.com/titan-go/titan/internal/memplan"
	"github.com/titan-go/titan/internal/mesh"
	"github.com/titan-go/titan/internal/metrics"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/model/hyena"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/optim"
	"github.com/titan-go/titan/internal/parallel"
	"github.com/titan-go/titan/internal/parallel/fsdp"
	"github.com/titan-go/titan/internal/runstore"
	"github.com/titan-go/titan/internal/tokenizer"
	"github.com/titan-go/titan/internal/trace"
)

// Trainer holds one run's state.
type Trainer struct {
	Job   *config.Job
	Opt   *optim.AdamW
	Sched optim.Schedule
	Tok   tokenizer.Tokenizer
	Data  *data.Loader
	Val   *data.Loader
	Step  int // steps completed
	// OnStep, when set, is called after every optimizer step.
	OnStep func(step int, loss float64)
	// RecipePath is the recipe file the job came from ("" for none), as
	// the run store records it.
	RecipePath string

	be         backend.Backend
	dist       Dist
	accum      int
	log        *metrics.Logger
	rec        *runstore.Recorder // the run store's recorder; nil when not recording
	out        io.Writer
	seed       uint64
	peakFLOPS  float64
	elapsed    float64   // seconds of training before this process's loop (resumed runs)
	loopStart  time.Time // when this process's training loop began; zero outside it
	schedStart int       // step the learning-rate schedule counts from (checkpoint.exclude_from_loading lr_scheduler)
	ckptFolder string
	ck         ckptState // checkpoint bookkeeping (state.go)
	dev        Device
	// mesh is the device mesh and groups its communication groups,
	// built once.
	mesh   *mesh.Mesh
	groups *parallel.Groups
	// fam is the model family, eng this rank's share of the model
	// whatever the layout, and pplan its pipeline plan.
	fam   model.Family
	eng   parallel.Engine
	pplan parallel.PipelinePlan
	// obs follows the ranks' step times (observe.go), prof records
	// the profiled steps (profile.go; nil without profiling).
	obs  *observer
	prof *profiler
	mem  *memSnapper // memory snapshots (memsnap.go); nil when off
}

// Device is the compute device a trainer runs on; the caller (cmd/titan)
// picks it.
type Device struct {
	Backend backend.Backend
	// Name describes it in the log ("cpu (gemm avx512), 2 threads").
	Name string
	// PeakFLOPS is one host's peak FLOP/s in the job's compute precision
	// (float32, or bfloat16 with bf16 parameters), the MFU reference:
	// the job's peak is it times the hosts, whatever the layout, so that
	// equal tokens/s prints equal MFU.
	PeakFLOPS float64
}

// Dist places a trainer in a data-parallel job.
type Dist struct {
	Rank, World int
	// Group holds every rank of the job; nil when World is 1.
	Group comm.Group
	// Hosts is the number of machines of the job (0 or 1: one); the
	// job's peak is the host peak times it.
	Hosts int
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
//
// dev is the device to compute on and dist places the trainer in a
// multi-process job (nil: one process). The ranks form the [parallelism]
// mesh pp × dp_replicate × dp_shard × cp × tp, on which a
// parallel.Engine holds this rank's share of the model. Every
// data-parallel rank reads the same global batch and trains on its rows.
// Rank 0 alone logs and writes checkpoints.
func New(job *config.Job, dev Device, out io.Writer, dist *Dist) (*Trainer, error) {
	fam, err := ModelFamily(job)
	if err != nil {
		return nil, err
	}
	if dev.Backend == nil {
		return nil, errors.New("train: no backend")
	}
	tr := &Trainer{Job: job, fam: fam, out: out, seed: seedOf(job), dist: Dist{World: 1}, dev: dev, be: dev.Backend}
	if dist != nil {
		tr.dist = *dist
	}
	var pplan parallel.PipelinePlan
	if tr.mesh, pplan, err = checkParallelism(job, fam, tr.dist.World); err != nil {
		return nil, err
	}
	tr.pplan = pplan
	if err := tr.checkMemory(); err != nil {
		return nil, err
	}
	if tr.dist.Rank != 0 {
		tr.out = io.Discard
	}
	tr.Tok, err = LoadTokenizer(job.Model.TokenizerPath)
	if err != nil {
		return nil, err
	}
	if tr.groups, err = parallel.NewGroups(tr.dist.Group, tr.mesh, tr.dist.Rank); err != nil {
		return nil, err
	}
	if tr.Tok.VocabSize() > fam.VocabSize() {
		return nil, fmt.Errorf("model.tokenizer_path %q: the %s tokenizer has %d tokens but model flavor %s has vocab_size %d", job.Model.TokenizerPath, tr.Tok.Name(), tr.Tok.VocabSize(), job.Model.Flavor, fam.VocabSize())
	}
	T, B := job.Training.SeqLen, job.Training.LocalBatchSize
	if tr.accum, err = job.AccumSteps(tr.dataRanks()); err != nil {
		return nil, err
	}
	v := job.Validation
	heldOut := v.Enable && v.Dataset == "" && v.DatasetPath == ""
	tr.Data, err = OpenData(job.Training.Dataset, job.Training.DatasetPath, T, B*tr.accum*tr.dataRanks(), tr.seed, tr.Tok, heldOut, false)
	if err != nil {
		return nil, fmt.Errorf("training dataset: %w", err)
	}
	if job.Validation.Enable {
		ds, path := v.Dataset, v.DatasetPath
		if heldOut {
			ds, path = job.Training.Dataset, job.Training.DatasetPath
		}
		if tr.Val, err = OpenData(ds, path, v.SeqLen, v.LocalBatchSize*tr.dataRanks(), tr.seed, tr.Tok, heldOut, heldOut); err != nil {
			return nil, fmt.Errorf("validation dataset: %w", err)
		}
	}
	be := dev.Backend
	reshard, err := fsdp.ParseReshard(job.Parallelism.FSDPReshardAfterForward)
	if err != nil {
		return nil, fmt.Errorf("parallelism: %w", err)
	}
	prec, reduce, err := Precision(job)
	if err != nil {
		return nil, err
	}
	opts := parallel.Options{Pipeline: pplan, T: T, Reshard: reshard, Precision: prec, Reduce: reduce}
	if v.Enable { // validation's own activation sets only when it runs
		opts.EvalRows, opts.EvalT = v.LocalBatchSize, v.SeqLen
	}
	if tr.eng, err = parallel.New(be, tr.fam, tr.groups, opts); err != nil {
		return nil, err
	}
	oc := job.Optimizer
	if tr.Opt, err = optim.New(be, tr.eng.Params().Len, optim.Config{
		Name: oc.Name, Implementation: oc.Implementation,
		LR: float32(oc.LR), Beta1: float32(oc.Beta1), Beta2: float32(oc.Beta2), Eps: float32(oc.Eps), WeightDecay: float32(oc.WeightDecay),
	}); err != nil {
		return nil, fmt.Errorf("optimizer: %w", err)
	}
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
	// MFU is the job's model FLOPs over the job's peak.
	tr.peakFLOPS = dev.PeakFLOPS * float64(max(tr.dist.Hosts, 1))
	tr.ckptFolder = filepath.Join(job.Job.DumpFolder, job.Checkpoint.Folder)
	tr.ck.lastFull = -1
	if err := tr.agreeSession(); err != nil {
		return nil, err
	}
	tr.eng.Init(tr.seed)
	if err := tr.restore(); err != nil {
		return nil, err
	}
	return tr, nil
}

// elapsedS is the seconds of training so far, over every process that
// trained this run (resumed runs count their checkpoint's).
func (tr *Trainer) elapsedS() float64 {
	if tr.loopStart.IsZero() {
		return tr.elapsed
	}
	return tr.elapsed + time.Since(tr.loopStart).Seconds()
}

// pipelineSettings are the job's parallelism.pipeline_parallel_* keys,
// with fam's stage costs.
func pipelineSettings(job *config.Job, fam model.Family) parallel.PipelineSettings {
	p := job.Parallelism
	return parallel.PipelineSettings{
		Degree: p.PipelineParallelDegree, Schedule: p.PipelineParallelSchedule, LayersPerStage: p.PipelineParallelLayersPerStage,
		FirstLessLayers: p.PipelineParallelFirstStageLessLayers, LastLessLayers: p.PipelineParallelLastStageLessLayers,
		MicrobatchSize: p.PipelineParallelMicrobatchSize,
		Costs:          parallel.PassCosts(fam, job.Training.SeqLen),
	}
}

// SavesCheckpoints reports whether job writes checkpoints: at its
// intervals, its last step and an interruption.
func SavesCheckpoints(job *config.Job) bool {
	return job.Checkpoint.Enable && !job.Checkpoint.LoadOnly
}

// CheckLayout refuses what titan train would refuse of job's
// [parallelism] layout before it starts any process: the pipeline's
// stages, the mesh and the model's tensor and context parallel checks,
// for a world of the recipe's degrees (data_parallel_shard_degree -1
// counted as 1).
func CheckLayout(job *config.Job, fam model.Family) error {
	p := job.Parallelism
	world := max(p.PipelineParallelDegree, 1) * max(p.DataParallelReplicateDegree, 1) * max(p.DataParallelShardDegree, 1) * max(p.ContextParallelDegree, 1) * max(p.TensorParallelDegree, 1)
	_, _, err := checkParallelism(job, fam, world)
	return err
}

// checkParallelism lays the world out on the [parallelism] mesh, refuses
// the layouts the model's shapes cannot split (pipeline stages, tensor
// and context parallel checks) and returns the mesh with the resolved
// pipeline plan.
func checkParallelism(job *config.Job, fam model.Family, world int) (*mesh.Mesh, parallel.PipelinePlan, error) {
	p := job.Parallelism
	var none parallel.PipelinePlan
	reshard, err := fsdp.ParseReshard(p.FSDPReshardAfterForward)
	if err != nil {
		return nil, none, fmt.Errorf("parallelism: %w", err)
	}
	pplan, err := parallel.PlanPipeline(fam.NumLayers(), job.Training.LocalBatchSize, pipelineSettings(job, fam))
	if err != nil {
		return nil, none, err
	}
	m, err := mesh.New(world, mesh.Degrees{PP: p.PipelineParallelDegree, DPReplicate: p.DataParallelReplicateDegree, DPShard: p.DataParallelShardDegree, CP: p.ContextParallelDegree, TP: p.TensorParallelDegree})
	if err != nil {
		return nil, none, err
	}
	if p.EnableAsyncTensorParallel {
		return nil, none, errors.New("parallelism.enable_async_tensor_parallel: not implemented yet (set it to false)")
	}
	if reshard != fsdp.ReshardDefault && m.DPShard*m.CP == 1 {
		return nil, none, fmt.Errorf("parallelism.fsdp_reshard_after_forward %q: nothing is sharded (data_parallel_shard_degree %d × context_parallel_degree %d = 1); leave it \"default\"", p.FSDPReshardAfterForward, m.DPShard, m.CP)
	}
	if err := fam.Check(job.Training.SeqLen, m.TP, m.CP); err != nil {
		return nil, none, err
	}
	if v := job.Validation; v.Enable {
		if v.SeqLen > fam.MaxSeqLen() {
			return nil, none, fmt.Errorf("validation.seq_len %d exceeds the %s %d of %s flavor %s", v.SeqLen, maxSeqKey(job), fam.MaxSeqLen(), job.Model.Name, job.Model.Flavor)
		}
		if err := fam.Check(v.SeqLen, m.TP, m.CP); err != nil {
			return nil, none, fmt.Errorf("validation.seq_len %d: %w", v.SeqLen, err)
		}
	}
	return m, pplan, nil
}

// stateBytes is the memory of this rank's parameters, gradients and
// optimizer moments (their shards under FSDP); gathered unit buffers are
// transient and not included.
func (tr *Trainer) stateBytes() int64 {
	return tr.eng.Memory().StateBytes + int64(tr.Opt.M.Len+tr.Opt.V.Len)*4
}

// dataRanks is the number of data-parallel ranks, the ranks that read
// different rows of the global batch (pipeline stages, tp and cp ranks
// read the same rows).
func (tr *Trainer) dataRanks() int { return tr.groups.DataRanks() }

// globalBatch is the sequences of a step: every data rank's accumulated
// local batches.
func (tr *Trainer) globalBatch() int {
	return tr.accum * tr.Job.Training.LocalBatchSize * tr.dataRanks()
}

// acPolicy is the recipe's activation checkpointing policy, as logged.
func (tr *Trainer) acPolicy() llama.ActivationCheckpoint { return acPolicy(tr.Job) }

func acPolicy(job *config.Job) llama.ActivationCheckpoint {
	ac := job.ActivationCheckpoint
	return llama.ActivationCheckpoint{Mode: ac.Mode, SelectiveOption: ac.SelectiveACOption}
}

// ModelFamily resolves the recipe's model — model.name "llama3" or
// "hyena", model.flavor one of that family's flavors — with its training
// settings, and checks that the recipe's shapes fit it.
func ModelFamily(job *config.Job) (model.Family, error) {
	var fam model.Family
	switch job.Model.Name {
	case "llama3":
		cfg, err := llama.Flavor(job.Model.Flavor)
		if err != nil {
			return nil, fmt.Errorf("model.flavor: %w", err)
		}
		fam = llama.Family{Cfg: cfg.Covering(job.SeqLens()...), Checkpoint: acPolicy(job)}
	case "hyena":
		cfg, err := hyena.Flavor(job.Model.Flavor)
		if err != nil {
			return nil, fmt.Errorf("model.flavor: %w", err)
		}
		if m := job.ActivationCheckpoint.Mode; m != "" && m != "none" {
			return nil, fmt.Errorf("activation_checkpoint.mode %q: activation checkpointing is not supported for hyena yet (set it to \"none\")", m)
		}
		if job.Training.MixedPrecisionParam != "float32" {
			return nil, fmt.Errorf("training.mixed_precision_param %q: not supported for hyena models yet (set it to \"float32\")", job.Training.MixedPrecisionParam)
		}
		if len(job.Model.Converters) > 0 {
			return nil, fmt.Errorf("model.converters %q: not supported for hyena models (remove it)", job.Model.Converters)
		}
		fam = hyena.Family{Cfg: cfg}
	default:
		return nil, fmt.Errorf("model.name %q: titan trains llama3 and hyena models", job.Model.Name)
	}
	if T := job.Training.SeqLen; T > fam.MaxSeqLen() {
		return nil, fmt.Errorf("training.seq_len %d exceeds the %s %d of %s flavor %s", T, maxSeqKey(job), fam.MaxSeqLen(), job.Model.Name, job.Model.Flavor)
	}
	return fam, nil
}

// Precision is the model's compute precision and the gradient reduction
// dtype of a validated recipe: training.mixed_precision_param,
// training.mixed_precision_reduce, model.converters and [float8].
func Precision(job *config.Job) (model.Precision, backend.DType, error) {
	dtype := func(s string) backend.DType {
		if s == "bfloat16" {
			return backend.BFloat16
		}
		return backend.Float32
	}
	p := model.Precision{Param: dtype(job.Training.MixedPrecisionParam)}
	var err error
	if p.Float8, err = job.Float8Config(); err != nil {
		return p, 0, err
	}
	return p, dtype(job.Training.MixedPrecisionReduce), nil
}

// maxSeqKey names the flavor key that bounds the sequence length.
func maxSeqKey(job *config.Job) string {
	if job.Model.Name == "hyena" {
		return "l_max"
	}
	return "max_seq_len"
}

// checkMemory refuses a job that cannot fit before anything large is
// allocated: memplan's estimate for llama3; for the other families the
// parameters, gradients and optimizer moments of the largest rank share
// (activations are not estimated yet).
func (tr *Trainer) checkMemory() error {
	avail, err := memplan.Available()
	if err != nil {
		return nil // unknown
	}
	avail /= int64(max(tr.dist.World/max(tr.dist.Hosts, 1), 1))
	if tr.Job.Model.Name == "llama3" {
		plan, err := memplan.FromJob(tr.Job, tr.dist.World)
		if err != nil {
			return err
		}
		rep, err := memplan.Estimate(plan)
		if err != nil {
			return err
		}
		return memplan.Check(rep, avail)
	}
	shard := max(tr.mesh.DPShard*tr.mesh.CP, 1)
	state := numParams(tr.fam) * 16 / int64(shard) / int64(tr.mesh.PP)
	if state > avail {
		return fmt.Errorf("memplan: the %s model's parameters, gradients and optimizer state need about %s per rank but only %s is available; shard them over more ranks (parallelism.data_parallel_shard_degree)", tr.fam.Name(), bytesize.Human(state), bytesize.Human(avail))
	}
	return nil
}

// Close releases the backend and the dump folder.
func (tr *Trainer) Close() {
	tr.unlock()
	if c, ok := tr.be.(interface{ Close() }); ok {
		c.Close()
	}
}

// Run trains until training.steps or until ctx is cancelled (Ctrl-C), in
// which case it saves a checkpoint and returns ctx's error. In a
// multi-rank job every rank stops at the same step.
//
// Rank 0 records the run in the run store (metrics.enable_db): its start,
// every logged step and how it ended.
func (tr *Trainer) Run(ctx context.Context) (err error) {
	job := tr.Job
	// Every exit waits for a save in flight; its error is the run's.
	defer func() {
		if werr := tr.waitSave(); err == nil {
			err = werr
		}
	}()
	folder := job.Job.DumpFolder
	if tr.dist.Rank != 0 && !job.Metrics.SaveForAllRanks {
		folder = "" // one metrics.jsonl per job, written by rank 0
	}
	mo := metrics.Options{Rank: tr.dist.Rank, SaveForAllRanks: job.Metrics.SaveForAllRanks, DisableColor: job.Metrics.DisableColorPrinting}
	if job.Metrics.EnableTensorboard {
		mo.TensorBoardFolder = job.Metrics.SaveTBFolder
	}
	tr.log, err = metrics.OpenWith(folder, tr.out, job.Training.Steps, mo)
	if err != nil {
		return err
	}
	defer tr.log.Close()
	B, T := job.Training.LocalBatchSize, job.Training.SeqLen
	batches := fmt.Sprintf("%d accumulated local batches", tr.accum)
	if tr.accum == 1 {
		batches = "1 local batch"
	}
	tr.log.Printf("titan: %s %s, %s parameters, %d sequences × %d tokens per step (%s of %d on each of %d data ranks), %s per rank, MFU against the job's peak of %.0f GFLOP/s, activation checkpointing %s (%.1f MiB of activations on rank 0)",
		job.Model.Name, job.Model.Flavor, humanCount(numParams(tr.fam)), tr.globalBatch(), T, batches, B, tr.dataRanks(), tr.dev.Name, tr.peakFLOPS/1e9,
		tr.acPolicy(), float64(tr.eng.Memory().ActivationBytes)/(1<<20))
	tr.log.Printf("titan: optimizer %s (%s)", tr.Opt.Name(), tr.Opt.Implementation())
	if tr.mesh != nil {
		tr.log.Printf("titan: mesh %s, fsdp_reshard_after_forward %s", tr.mesh, reshardLine(job.Parallelism.FSDPReshardAfterForward, tr.mesh))
	}
	if tr.mesh.PP > 1 {
		tr.log.Printf("titan: pipeline %s", tr.pplan)
	}
	if job.Training.Deterministic {
		tr.log.Printf("titan: deterministic: on (titan's kernels and collectives are deterministic in every mode: a run reproduces bit for bit)")
	}
	for _, w := range memplan.Warnings(job) {
		tr.log.Printf("titan: warning: %s", w)
	}
	if tr.obs, err = tr.newObserver(); err != nil {
		return err
	}
	if tr.prof, err = tr.newProfiler(tr.obs.hosts); err != nil {
		return err
	}
	tr.mem = tr.newMemSnapper(tr.obs.hosts)
	defer tr.mem.close()
	watch := memplan.NewLossWatch(tr.fam.VocabSize(), job.Optimizer.LR)
	tr.logNotes()
	if job.Checkpoint.CreateSeedCheckpoint {
		return tr.createSeed()
	}
	if tr.Step > 0 {
		tr.log.Printf("titan: resumed from %s at step %d", checkpointDir(tr.ckptFolder, tr.Step), tr.Step)
	}
	if dir := os.Getenv(ResaveEnv); dir != "" && job.Checkpoint.Enable {
		if err := tr.resave(dir); err != nil {
			return err
		}
	}
	if job.Checkpoint.Enable && job.Checkpoint.LoadOnly {
		tr.log.Printf("titan: checkpoint.load_only: no checkpoint will be saved")
	}
	if tr.Step >= job.Training.Steps {
		tr.log.Printf("titan: the checkpoints in %s already trained %d of %d steps; nothing to do (raise training.steps to train on, or set job.dump_folder to start a new run)", tr.ckptFolder, tr.Step, job.Training.Steps)
		return nil
	}
	tr.startRecording()
	defer func() { tr.endRecording(err) }()
	flopsPerToken := tr.fam.FLOPsPerToken(T)
	logFreq := max(1, job.Metrics.LogFreq)
	tr.loopStart = time.Now()
	// Tokens/s is measured over the steps since the last log line; the
	// loss, gradient norm and learning rate logged are the step's own, as
	// torchtitan logs them (and as loss_steps.jsonl, titan top and the
	// Prometheus gauges show them), so runs logged at other frequencies
	// compare step for step.
	windowStart, windowTokens := time.Now(), 0
	// windowRecord is a step's record with the window's throughput
	// (the caller adds memory and validation where it logs them).
	windowRecord := func(loss, gnorm, lr float64) metrics.Record {
		tps := float64(windowTokens) / time.Since(windowStart).Seconds()
		rec := metrics.Record{Step: tr.Step, Loss: loss, GradNorm: gnorm, LR: lr,
			TokensPerSec: tps, TFLOPs: flopsPerToken * tps / 1e12,
			Tokens: int64(tr.Step) * int64(tr.accum*B*T*tr.dataRanks()), ElapsedS: tr.elapsedS()}
		if tr.peakFLOPS > 0 {
			rec.MFU = 100 * flopsPerToken * tps / tr.peakFLOPS
		}
		return rec
	}
	var last struct{ loss, gnorm, lr float64 } // the last step's, for a log line at an interruption
	balanceChecked := false
	for tr.Step < job.Training.Steps {
		// A background save that failed fails the run here.
		if err := tr.pollSave(); err != nil {
			return err
		}
		stop, err := tr.agree(ctx.Err() != nil)
		if err != nil {
			return err
		}
		if stop {
			if windowTokens > 0 {
				// The steps since the last log line: logged (and
				// recorded) so that the run ends at the step it reached.
				rec := windowRecord(last.loss, last.gnorm, last.lr)
				if err := tr.log.Log(rec); err != nil {
					return err
				}
				tr.recordStep(rec)
			}
			if !SavesCheckpoints(job) {
				// As at the last step: checkpoint.enable off saves nothing.
				tr.log.Printf("titan: interrupted after step %d; checkpoint.enable is off, so no checkpoint is saved", tr.Step)
				return context.Canceled
			}
			if tr.ck.lastFull == tr.Step {
				// The step's full checkpoint is written already (a
				// periodic save right before, or the one resumed from):
				// writing it again would only cost the time.
				tr.log.Printf("titan: interrupted after step %d, whose checkpoint is already saved", tr.Step)
				if err := tr.waitSave(); err != nil {
					return err
				}
				return context.Canceled
			}
			tr.log.Printf("titan: interrupted after step %d; saving a checkpoint", tr.Step)
			if err := tr.save(false, true); err != nil {
				return err
			}
			return context.Canceled
		}
		tr.prof.beginStep(tr.Step + 1)
		tr.mem.beginStep(tr.Step + 1)
		tr.obs.begin()
		stepStart := time.Now()
		loss, gnorm, lr, err := tr.TrainStep()
		if err != nil {
			return fmt.Errorf("step %d: %w", tr.Step+1, err)
		}
		tr.ck.stepS = time.Since(stepStart).Seconds()
		tr.obs.end(tr.Step, loss)
		if err := tr.mem.endStep(tr.Step); err != nil {
			return err
		}
		windowTokens += tr.accum * B * T * tr.dataRanks()
		last.loss, last.gnorm, last.lr = loss, gnorm, lr
		if math.IsNaN(loss) || math.IsInf(loss, 0) {
			// The run store keeps the step that diverged (the analyses
			// that look for it need it), then the run fails.
			tr.recordStep(windowRecord(loss, gnorm, lr))
			return fmt.Errorf("step %d: loss is %v", tr.Step, loss)
		}
		if w := watch.Observe(tr.Step, loss); w != "" {
			tr.log.Printf("titan: warning: %s", w)
		}
		if tr.OnStep != nil {
			tr.OnStep(tr.Step, loss)
		}
		if err := tr.log.Step(tr.Step, loss); err != nil {
			return err
		}
		var val *float64
		if tr.Val != nil && job.Validation.Freq > 0 && tr.Step%job.Validation.Freq == 0 {
			valStart := time.Now()
			v, err := tr.Validate(job.Validation.Steps)
			if err != nil {
				return err
			}
			val = &v
			// Tokens/s is training's: the validation's time is left out
			// of the window.
			windowStart = windowStart.Add(time.Since(valStart))
		}
		if tr.Step%logFreq == 0 || tr.Step == 1 || tr.Step == job.Training.Steps || val != nil {
			ps, err := tr.eng.PipelineStep()
			if err != nil {
				return err
			}
			if ps != nil {
				tr.log.Printf("titan: %s", ps)
				if !balanceChecked && tr.Step > 1 {
					// Once, on the first step measured after the first
					// (which warms up): is a rank the others wait on?
					balanceChecked = true
					if w := parallel.BalanceWarning(tr.fam.NumLayers(), B, pipelineSettings(job, tr.fam), tr.pplan, ps.StageCosts); w != "" {
						tr.log.Printf("titan: warning: %s", w)
					}
				}
			}
			mem, err := tr.maxOverRanks(metrics.PeakRSSGiB())
			if err != nil {
				return err
			}
			state, err := tr.maxOverRanks(float64(tr.stateBytes()) / (1 << 30))
			if err != nil {
				return err
			}
			gathered, err := tr.maxOverRanks(float64(tr.eng.Memory().GatheredUnits))
			if err != nil {
				return err
			}
			rec := windowRecord(loss, gnorm, lr)
			rec.MemGiB, rec.StateGiB, rec.GatheredUnits, rec.ValLoss = mem, state, int(gathered), val
			if err := tr.log.Log(rec); err != nil {
				return err
			}
			tr.recordStep(rec)
			windowStart, windowTokens = time.Now(), 0
		}
		ck := job.Checkpoint
		interval := ck.Interval > 0 && tr.Step%ck.Interval == 0
		first := ck.EnableFirstStepCheckpoint && tr.Step == 1
		if ck.Enable && tr.Step < job.Training.Steps && (interval || first) {
			span := trace.Begin(trace.CatCheckpoint, "checkpoint save")
			err := tr.save(false, false)
			span.End()
			if err != nil {
				return err
			}
		}
		if err := tr.prof.endStep(tr.Step); err != nil {
			return err
		}
	}
	tr.elapsed, tr.loopStart = tr.elapsedS(), time.Time{}
	if g := tr.eng.Gathers(); g.Gathers > 0 {
		prec, _, _ := Precision(tr.Job) // validated in New
		tr.log.Printf("titan: fsdp: %s", gatherLine(g, prec))
	}
	if tr.dist.Rank == 0 {
		if err := tr.log.Close(); err != nil {
			return err
		}
		if path, err := metrics.PlotRun(job.Job.DumpFolder, fmt.Sprintf("%s %s: %s", job.Model.Name, job.Model.Flavor, job.Job.Description)); err == nil {
			fmt.Fprintf(tr.out, "titan: loss curve %s\n", path)
		}
	}
	if job.Checkpoint.Enable {
		return tr.saveLast()
	}
	return nil
}

// commCtx is the context of the trainer's collectives: not the run's
// context, which Ctrl-C cancels while ranks still have to agree to stop.
var commCtx = context.Background()

// agree reports whether any rank wants to stop. The same all-reduce
// brings every rank's figures of the previous step to rank 0 (observer).
func (tr *Trainer) agree(stop bool) (bool, error) {
	v := tr.obs.pack(stop)
	if tr.dist.World > 1 {
		if err := tr.dist.Group.AllReduce(commCtx, comm.F64(v), comm.Sum); err != nil {
			return false, err
		}
	}
	if err := tr.obs.received(v); err != nil {
		return false, err
	}
	return v[0] > 0, nil
}

// maxOverRanks returns the largest x of all ranks.
func (tr *Trainer) maxOverRanks(x float64) (float64, error) {
	if tr.dist.World == 1 {
		return x, nil
	}
	v := []float64{x}
	err := tr.dist.Group.AllReduce(commCtx, comm.F64(v), comm.Max)
	return v[0], err
}

// sumOverRanks adds x over all ranks, in place.
func (tr *Trainer) sumOverRanks(x []float64) error {
	if tr.dist.World == 1 {
		return nil
	}
	return tr.dist.Group.AllReduce(commCtx, comm.F64(x), comm.Sum)
}

// TrainStep runs one optimizer step over the global batch (accumulating
// gradients over microbatches and summing them over ranks) and returns the
// mean loss over the global batch, the gradient norm before clipping and
// the learning rate used.
func (tr *Trainer) TrainStep() (loss, gradNorm, lr float64, err error) {
	batch, err := tr.Data.Next()
	if err != nil {
		return 0, 0, 0, err
	}
	// The loss is normalised by the targets of the whole global batch, so
	// the summed gradient is that of the global mean loss.
	targets := 0
	for _, l := range batch.Labels {
		if l >= 0 {
			targets++
		}
	}
	if targets == 0 {
		return 0, 0, 0, errors.New("the batch has no targets")
	}
	mine, err := batch.Shard(tr.groups.DataRank(), tr.groups.DataRanks())
	if err != nil {
		return 0, 0, 0, err
	}
	span := trace.Begin(trace.CatCompute, "forward_backward")
	sum, err := tr.eng.ForwardBackward(mine.Inputs, mine.Labels, tr.accum, 1/float32(targets))
	span.End()
	if err != nil {
		return 0, 0, 0, err
	}
	span = trace.Begin(trace.CatCompute, "grad_norm")
	sumSq, err := tr.eng.GradSumSquares()
	span.End()
	if err != nil {
		return 0, 0, 0, err
	}
	norm, scale := optim.ClipScale(sumSq, float32(tr.Job.Training.MaxNorm))
	lr = tr.Sched.LR(tr.Step - tr.schedStart)
	span = trace.Begin(trace.CatOptimizer, "optimizer")
	err = tr.Opt.Update(tr.eng.Params(), tr.eng.Grads(), float32(lr), scale)
	span.End()
	if err != nil {
		return 0, 0, 0, err
	}
	tr.eng.Updated()
	tr.Step++
	return sum / float64(targets), norm, lr, nil
}

// Validate returns the mean loss over steps batches of the validation
// set (steps <= 0: 10 batches), each rank scoring its rows.
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
		mine, err := b.Shard(tr.groups.DataRank(), tr.groups.DataRanks())
		if err != nil {
			return 0, err
		}
		l, k, err := tr.eng.Evaluate(mine.Inputs, mine.Labels)
		if err != nil {
			return 0, err
		}
		sum, n = sum+l, n+k
	}
	return sum / float64(max(n, 1)), nil
}

// numParams is the number of parameters of fam.
func numParams(fam model.Family) int64 {
	ts := fam.Tensors()
	return int64(ts[len(ts)-1].Offset + ts[len(ts)-1].Size)
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

// gatherLine describes the FSDP parameter all-gathers of a run.
func gatherLine(g fsdp.GatherStats, p model.Precision) string {
	dt := "float32"
	if p.BF16() {
		dt = "bfloat16"
	}
	f8 := ""
	if p.Float8 != nil {
		as := dt
		if p.Float8.FSDPAllGather {
			as = "e4m3"
		}
		f8 = fmt.Sprintf(" (float8 weights %d B as %s, other parameters %d B, padding %d B; %d float8 amax all-reduces)", g.Float8Weights, as, g.Other, g.Padding, g.ScaleReductions)
	}
	return fmt.Sprintf("%d parameter all-gathers gathered %d B on this rank (its own shards included)%s", g.Gathers, g.Bytes(), f8)
}

// reshardLine is the start-up line's fsdp_reshard_after_forward: the
// setting and, for "default", the policy it stands for on mesh m.
func reshardLine(setting string, m *mesh.Mesh) string {
	if setting != "" && setting != "default" {
		return strconv.Quote(setting)
	}
	if m.DPShard*m.CP == 1 {
		return `"default" (nothing is sharded)`
	}
	if fsdp.ReshardDefault.Resolve(m.PP > 1) == fsdp.ReshardNever {
		return `"default" (never: under pipeline parallelism a unit stays gathered for the step)`
	}
	return `"default" (always)`
}
