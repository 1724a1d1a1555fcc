package config

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Allowed values of the enumerated keys.
var (
	optimizerNames         = []string{"AdamW", "Adam"}
	optimizerImpls         = []string{"fused", "foreach", "for-loop"}
	decayTypes             = []string{"linear", "sqrt", "cosine"}
	precisions             = []string{"float32", "bfloat16"}
	devices                = []string{"", "cpu", "cuda"}
	float8Recipes          = []string{"tensorwise", "rowwise", "rowwise_with_gw_hp"}
	reshardModes           = []string{"default", "always", "never"}
	rotateMethods          = []string{"allgather", "alltoall"}
	exportDtypes           = []string{"float32", "bfloat16", "float16"}
	asyncModes             = []string{"disabled", "async", "async_with_pinned_mem"}
	acModes                = []string{"selective", "full", "none"}
	pipelineSchedules      = []string{"1F1B", "GPipe", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble"}
	pipelineSchedulesLower = lowerAll(pipelineSchedules)
	// unsupportedSchedules are torchtitan schedules titan does not run.
	unsupportedSchedules = []string{"DualPipeV"}
	// loadableStates are the parts of a checkpoint that
	// checkpoint.exclude_from_loading can leave out (torchtitan's names).
	loadableStates = []string{"model", "optimizer", "lr_scheduler", "dataloader", "train_state"}
	// datasetKinds are the corpus formats of package data ("" = detect).
	datasetKinds = []string{"", "text", "jsonl", "tokens", "gosrc"}
)

func lowerAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strings.ToLower(s)
	}
	return out
}

// quoteAll renders choices as "a", "b", "c".
func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ", ")
}

// validator collects the problems of a Job.
type validator struct{ errs []error }

func (v *validator) fail(key string, value any, format string, args ...any) {
	if s, ok := value.(string); ok {
		value = strconv.Quote(s)
	}
	msg := fmt.Sprintf("%s = %v: %s", key, value, fmt.Sprintf(format, args...))
	v.errs = append(v.errs, &KeyError{Key: key, Err: ErrInvalid, msg: msg})
}

func (v *validator) atLeast(key string, x, lo int) {
	if x < lo {
		v.fail(key, x, "must be >= %d", lo)
	}
}

// atLeastOrMinus1 checks x >= lo, or x == -1 (meaning "derive it").
func (v *validator) atLeastOrMinus1(key string, x, lo int, meaning string) {
	if x != -1 && x < lo {
		v.fail(key, x, "must be >= %d, or -1 for %s", lo, meaning)
	}
}

func (v *validator) positive(key string, x float64) {
	if !(x > 0) || math.IsInf(x, 0) {
		v.fail(key, x, "must be a finite number > 0")
	}
}

// inRange checks lo <= x <= hi (hiOpen: x < hi).
func (v *validator) inRange(key string, x, lo, hi float64, hiOpen bool) {
	ok := x >= lo && x <= hi && !(hiOpen && x == hi)
	if !ok {
		closing := "]"
		if hiOpen {
			closing = ")"
		}
		v.fail(key, x, "must be in [%g, %g%s", lo, hi, closing)
	}
}

// oneOf reports x unless it is one of allowed, and returns whether it is.
func (v *validator) oneOf(key, x string, allowed []string) bool {
	if !slices.Contains(allowed, x) {
		v.fail(key, x, "must be one of %s", quoteAll(allowed))
		return false
	}
	return true
}

// unsupported reports a value that torchtitan accepts and titan does not
// implement yet; accepted says which value titan does accept.
func (v *validator) unsupported(key string, value any, accepted string) {
	v.fail(key, value, "not supported yet (titan accepts only %s)", accepted)
}

// unchanged refuses a setting of a key that only tunes a feature titan
// does not have yet (what), unless it is the default.
func (v *validator) unchanged(key string, x, def any, what string) {
	for _, e := range v.errs {
		if ke, ok := e.(*KeyError); ok && ke.Key == key {
			return // already refused for its value
		}
	}
	if x != def {
		v.fail(key, x, "not supported yet: it only tunes %s, which titan does not have (leave it at %v)", what, def)
	}
}

// only refuses a value other than the one titan implements.
func (v *validator) only(key, x, want string) {
	if x != want {
		v.unsupported(key, x, strconv.Quote(want))
	}
}

// off refuses a feature switch that is on.
func (v *validator) off(key string, on bool) {
	if on {
		v.unsupported(key, on, "false")
	}
}

func (v *validator) notEmpty(key, x string) {
	if x == "" {
		v.fail(key, x, "must not be empty")
	}
}

// dataset checks a section's dataset kind, and that the kinds read from
// files have a path.
func (v *validator) dataset(sec, kind, path string) {
	v.oneOf(sec+".dataset", kind, datasetKinds)
	if path == "" && kind != "" && kind != "gosrc" && slices.Contains(datasetKinds, kind) {
		v.fail(sec+".dataset_path", path, "%s.dataset %q reads files: set the path of the file or folder", sec, kind)
	}
}

// Validate checks that every value is in range and every choice is one of
// the allowed ones, and that related keys agree. It reports all problems at
// once (errors.Join of *KeyError, each wrapping ErrInvalid). It does not
// check what only other packages or the machine know: that a model flavor
// exists, that files and folders exist, or that the parallel degrees fit the
// number of workers.
func (j *Job) Validate() error {
	v := &validator{}

	v.notEmpty("job.dump_folder", j.Job.DumpFolder)

	p := j.Profiling
	v.atLeast("profiling.profile_freq", p.ProfileFreq, 1)
	v.atLeast("profiling.profiler_active", p.ProfilerActive, 1)
	v.atLeast("profiling.profiler_warmup", p.ProfilerWarmup, 0)
	// Accepted by the schema, not built yet: refused by name rather than
	// ignored (the trainer would train as if it were unset).
	v.off("parallelism.disable_loss_parallel", j.Parallelism.DisableLossParallel)
	// Profiling (traces and memory snapshots) and TensorBoard write into
	// folders under job.dump_folder: they need a name when on.
	if p.EnableProfiling {
		v.notEmpty("profiling.save_traces_folder", p.SaveTracesFolder)
		if p.ProfileFreq >= 1 && p.ProfilerActive >= 1 && p.ProfilerWarmup >= 0 && p.ProfilerActive+p.ProfilerWarmup > p.ProfileFreq {
			v.fail("profiling.profile_freq", p.ProfileFreq, "must be at least profiling.profiler_active %d + profiling.profiler_warmup %d (each window of profile_freq steps warms up, then records)", p.ProfilerActive, p.ProfilerWarmup)
		}
	}
	if p.EnableMemorySnapshot {
		v.notEmpty("profiling.save_memory_snapshot_folder", p.SaveMemorySnapshotFolder)
	}

	v.atLeast("metrics.log_freq", j.Metrics.LogFreq, 1)
	if j.Metrics.EnableTensorboard {
		v.notEmpty("metrics.save_tb_folder", j.Metrics.SaveTBFolder)
	}
	if db := j.Metrics.DB; strings.Contains(db, "://") && !strings.HasPrefix(db, "postgres://") && !strings.HasPrefix(db, "postgresql://") {
		v.fail("metrics.db", db, "want a SQLite file path or a postgres:// (postgresql://) URL")
	}

	m := j.Model
	v.notEmpty("model.name", m.Name)
	v.notEmpty("model.flavor", m.Flavor)
	if len(m.Converters) > 1 || len(m.Converters) == 1 && m.Converters[0] != "float8" {
		v.unsupported("model.converters", tomlList(m.Converters), `[] (no converters) or ["float8"]`)
	}
	f8 := j.Float8
	if v.oneOf("float8.recipe_name", f8.RecipeName, float8Recipes) {
		if f8.EnableFSDPFloat8AllGather && f8.RecipeName != "tensorwise" {
			v.fail("float8.enable_fsdp_float8_all_gather", true, "needs float8.recipe_name \"tensorwise\" (got %q): rowwise scales are per row of the whole weight", f8.RecipeName)
		}
	}
	if f8.EnableFSDPFloat8AllGather && !slices.Contains(m.Converters, "float8") {
		v.fail("float8.enable_fsdp_float8_all_gather", true, `needs model.converters = ["float8"] (no linear layer computes in float8)`)
	}
	if f8.PrecomputeFloat8DynamicScaleForFSDP && !f8.EnableFSDPFloat8AllGather {
		v.fail("float8.precompute_float8_dynamic_scale_for_fsdp", true, "needs float8.enable_fsdp_float8_all_gather = true")
	}

	o := j.Optimizer
	v.oneOf("optimizer.name", o.Name, optimizerNames)
	v.positive("optimizer.lr", o.LR)
	v.inRange("optimizer.beta1", o.Beta1, 0, 1, true)
	v.inRange("optimizer.beta2", o.Beta2, 0, 1, true)
	v.positive("optimizer.eps", o.Eps)
	if !(o.WeightDecay >= 0) || math.IsInf(o.WeightDecay, 0) {
		v.fail("optimizer.weight_decay", o.WeightDecay, "must be a finite number >= 0")
	}
	v.oneOf("optimizer.implementation", o.Implementation, optimizerImpls)

	s := j.LRScheduler
	v.atLeast("lr_scheduler.warmup_steps", s.WarmupSteps, 0)
	if s.TotalSteps != nil {
		v.atLeast("lr_scheduler.total_steps", *s.TotalSteps, 1)
	}
	if s.DecayRatio != nil {
		v.inRange("lr_scheduler.decay_ratio", *s.DecayRatio, 0, 1, false)
	}
	v.oneOf("lr_scheduler.decay_type", s.DecayType, decayTypes)
	v.inRange("lr_scheduler.min_lr_factor", s.MinLRFactor, 0, 1, false)

	t := j.Training
	v.dataset("training", t.Dataset, t.DatasetPath)
	v.atLeast("training.local_batch_size", t.LocalBatchSize, 1)
	v.atLeastOrMinus1("training.global_batch_size", t.GlobalBatchSize, 1, "local_batch_size × data-parallel degree")
	if t.GlobalBatchSize > 0 && t.LocalBatchSize > 0 && t.GlobalBatchSize%t.LocalBatchSize != 0 {
		v.fail("training.global_batch_size", t.GlobalBatchSize,
			"must be a multiple of training.local_batch_size (%d)", t.LocalBatchSize)
	}
	v.atLeast("training.seq_len", t.SeqLen, 1)
	if !(t.MaxNorm > 0) {
		v.fail("training.max_norm", t.MaxNorm, "must be > 0")
	}
	v.atLeast("training.steps", t.Steps, 1)
	v.atLeast("training.gradient_accumulation_steps", t.GradientAccumulationSteps, 0)
	if t.GradientAccumulationSteps > 0 && t.GlobalBatchSize != -1 {
		v.fail("training.gradient_accumulation_steps", t.GradientAccumulationSteps,
			"set either it or training.global_batch_size (%d), not both", t.GlobalBatchSize)
	}
	if t.Seed != nil {
		v.atLeast("training.seed", *t.Seed, 0)
	}
	v.oneOf("training.mixed_precision_param", t.MixedPrecisionParam, precisions)
	v.oneOf("training.mixed_precision_reduce", t.MixedPrecisionReduce, precisions)
	v.atLeast("training.threads", t.Threads, 0)
	v.oneOf("training.device", t.Device, devices)

	par := j.Parallelism
	v.atLeast("parallelism.data_parallel_replicate_degree", par.DataParallelReplicateDegree, 1)
	v.atLeastOrMinus1("parallelism.data_parallel_shard_degree", par.DataParallelShardDegree, 1, "the workers left over")
	v.oneOf("parallelism.fsdp_reshard_after_forward", par.FSDPReshardAfterForward, reshardModes)
	v.atLeast("parallelism.tensor_parallel_degree", par.TensorParallelDegree, 1)
	v.off("parallelism.enable_async_tensor_parallel", par.EnableAsyncTensorParallel)
	v.atLeast("parallelism.pipeline_parallel_degree", par.PipelineParallelDegree, 1)
	if slices.Contains(lowerAll(unsupportedSchedules), strings.ToLower(par.PipelineParallelSchedule)) {
		v.unsupported("parallelism.pipeline_parallel_schedule", par.PipelineParallelSchedule,
			"one of "+quoteAll(pipelineSchedules)+" (any case)")
	} else if !slices.Contains(pipelineSchedulesLower, strings.ToLower(par.PipelineParallelSchedule)) {
		v.fail("parallelism.pipeline_parallel_schedule", par.PipelineParallelSchedule,
			"must be one of %s (any case)", quoteAll(pipelineSchedules))
	}
	v.atLeast("parallelism.pipeline_parallel_microbatch_size", par.PipelineParallelMicrobatchSize, 1)
	if par.PipelineParallelLayersPerStage != nil {
		v.atLeast("parallelism.pipeline_parallel_layers_per_stage", *par.PipelineParallelLayersPerStage, 1)
	}
	v.atLeast("parallelism.pipeline_parallel_first_stage_less_layers", par.PipelineParallelFirstStageLessLayers, 0)
	v.atLeast("parallelism.pipeline_parallel_last_stage_less_layers", par.PipelineParallelLastStageLessLayers, 0)
	v.atLeast("parallelism.context_parallel_degree", par.ContextParallelDegree, 1)
	// titan's ring attention passes key/value blocks point to point, which
	// is torchtitan's "alltoall" rotation.
	if v.oneOf("parallelism.context_parallel_rotate_method", par.ContextParallelRotateMethod, rotateMethods) {
		v.only("parallelism.context_parallel_rotate_method", par.ContextParallelRotateMethod, "alltoall")
	}

	c := j.Checkpoint
	v.notEmpty("checkpoint.folder", c.Folder)
	v.atLeast("checkpoint.interval", c.Interval, 1)
	if v.oneOf("checkpoint.export_dtype", c.ExportDtype, exportDtypes) {
		if c.ExportDtype == "float16" {
			v.unsupported("checkpoint.export_dtype", c.ExportDtype, `"float32" and "bfloat16"`)
		} else if c.ExportDtype != "float32" && !c.LastSaveInHF {
			// titan's own checkpoints hold float32; the dtype is the
			// Hugging Face export's.
			v.fail("checkpoint.export_dtype", c.ExportDtype, "applies to the Hugging Face export of the last step: set checkpoint.last_save_in_hf = true (titan checkpoints store float32)")
		}
	}
	v.oneOf("checkpoint.async_mode", c.AsyncMode, asyncModes)
	if c.LastSaveInHF && j.Model.Name == "hyena" {
		v.fail("checkpoint.last_save_in_hf", true, "Hugging Face export is for llama3 models; %s is a hyena model", j.Model.Flavor)
	}
	if c.InitialLoadInHF && c.InitialLoadPath == "" {
		v.fail("checkpoint.initial_load_in_hf", true, "needs checkpoint.initial_load_path, the Hugging Face folder to start from")
	}
	if c.InitialLoadInHF && !c.InitialLoadModelOnly {
		v.fail("checkpoint.initial_load_model_only", false, "a Hugging Face folder holds weights only: checkpoint.initial_load_in_hf needs initial_load_model_only = true")
	}
	if c.CreateSeedCheckpoint && !c.Enable {
		v.fail("checkpoint.create_seed_checkpoint", true, "needs checkpoint.enable = true (the seed is a checkpoint)")
	}
	if c.KeepLatestK < 0 || c.KeepLatestK == 1 {
		v.fail("checkpoint.keep_latest_k", c.KeepLatestK,
			"must be 0 (keep all) or >= 2 (the newest checkpoint may still be being written)")
	}
	v.atLeastOrMinus1("checkpoint.load_step", c.LoadStep, 0, "the newest")
	for _, e := range c.ExcludeFromLoading {
		if slices.Contains(loadableStates, e) {
			continue
		}
		hint := ""
		if best, ok := nearest(e, loadableStates); ok {
			hint = fmt.Sprintf("; did you mean %q?", best)
		}
		v.fail("checkpoint.exclude_from_loading", fmt.Sprintf("%q", c.ExcludeFromLoading),
			"%q is not a part of a checkpoint: the parts are %s%s", e, quoteAll(loadableStates), hint)
	}

	ac := j.ActivationCheckpoint
	v.oneOf("activation_checkpoint.mode", ac.Mode, acModes)
	if ac.SelectiveACOption != "op" {
		if n, err := strconv.Atoi(ac.SelectiveACOption); err != nil || n < 1 {
			v.fail("activation_checkpoint.selective_ac_option", ac.SelectiveACOption,
				`must be "op" or a positive integer such as "2"`)
		}
	}

	val := j.Validation
	v.dataset("validation", val.Dataset, val.DatasetPath)
	v.atLeast("validation.local_batch_size", val.LocalBatchSize, 1)
	v.atLeast("validation.seq_len", val.SeqLen, 1)
	v.atLeast("validation.freq", val.Freq, 1)
	v.atLeastOrMinus1("validation.steps", val.Steps, 1, "the whole validation set")

	cm := j.Comm
	v.atLeast("comm.init_timeout_seconds", cm.InitTimeoutSeconds, 1)
	v.atLeast("comm.train_timeout_seconds", cm.TrainTimeoutSeconds, 1)
	v.atLeast("comm.trace_buf_size", cm.TraceBufSize, 0)

	return errors.Join(v.errs...)
}

// tomlList is a list of strings as a recipe writes it, ["a", "b"]; a
// fmt.Stringer so that the validator prints it unquoted.
type tomlList []string

func (l tomlList) String() string { return "[" + quoteAll(l) + "]" }
