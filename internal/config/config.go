// Package config defines titan's training recipe: the Job struct, its
// defaults, how a recipe is loaded and layered, and how it is validated.
//
// A recipe is a TOML file whose sections and keys carry torchtitan's names
// (the TOML-era JobConfig), so a torchtitan user recognises
//
//	[training]
//	local_batch_size = 8
//	seq_len = 2048
//	steps = 10000
//
// at once. A few keys are titan's own (training.threads,
// training.gradient_accumulation_steps, training.seed and
// training.deterministic, which torchtitan later moved to [debug]); the doc
// comment of each field says so. Keys of torchtitan that titan does not
// implement (torch.compile, Float8, fault tolerance, ...) are rejected with a
// message saying so, rather than silently ignored.
//
// # Layers
//
// Load resolves a Job from four layers, each overriding the one before:
//
//  1. built-in defaults (Default),
//  2. the recipe file,
//  3. environment variables TITAN_<SECTION>_<KEY>, for example
//     TITAN_TRAINING_STEPS=5 or TITAN_LR_SCHEDULER_WARMUP_STEPS=0,
//  4. --set section.key=value overrides, applied in the order given.
//
// # Strictness, and what viper does
//
// Every key of every layer is checked before it is used: an unknown key or
// section is an error that names the key, where it came from (file and line,
// environment variable, or --set argument) and the nearest valid key; a value
// of the wrong type is an error naming the key, the value and the wanted type.
// viper alone cannot give these errors: it lowercases keys, ignores keys it
// does not know, and converts types leniently ("ten" becomes 0). So the
// recipe file is first parsed with go-toml into a plain map and each key and
// value is checked against the Job struct by reflection; environment values
// and --set values, which are strings, are parsed by the type of the field
// they name.
//
// viper then does the layering: the defaults go in with SetDefault, viper
// reads the recipe file's contents (ReadConfig, TOML), the checked
// environment and --set values go in with Set in order, and viper's Unmarshal
// (mapstructure, with weak typing turned off and unused keys an error as a
// second line of defence) fills the Job. The one thing viper is not asked to
// do is read the environment: viper only looks at the process environment,
// while Load takes the environment as an argument (os.Environ() in
// production) so that tests can inject it; and titan must reject unknown
// TITAN_ variables, which viper's AutomaticEnv never sees.
//
// Environment variables whose names start with TITAN_<SECTION>_ for a
// section of the recipe are reserved for recipe keys: an unknown one is an
// error. Other TITAN_ variables (TITAN_NUM_THREADS, for example) are left to
// whoever reads them.
//
// Relative paths in a recipe are relative to the working directory, not to
// the recipe file, as in torchtitan.
//
// Optional keys (a pointer field, torchtitan's "int | None") have no value by
// default. TOML cannot write "none", so a recipe can only set them; an
// environment variable or --set with an empty value (--set
// lr_scheduler.decay_ratio=) clears one again.
package config

import (
	"fmt"
	"slices"

	"github.com/titan-go/titan/internal/float8"
)

// Job is a fully resolved training recipe, one field per TOML section. The
// field names follow Go conventions; the toml and mapstructure tags carry the
// torchtitan section and key names.
type Job struct {
	Job                  JobSection           `toml:"job" mapstructure:"job"`
	Profiling            Profiling            `toml:"profiling" mapstructure:"profiling"`
	Metrics              Metrics              `toml:"metrics" mapstructure:"metrics"`
	Model                Model                `toml:"model" mapstructure:"model"`
	Optimizer            Optimizer            `toml:"optimizer" mapstructure:"optimizer"`
	LRScheduler          LRScheduler          `toml:"lr_scheduler" mapstructure:"lr_scheduler"`
	Training             Training             `toml:"training" mapstructure:"training"`
	Parallelism          Parallelism          `toml:"parallelism" mapstructure:"parallelism"`
	Checkpoint           Checkpoint           `toml:"checkpoint" mapstructure:"checkpoint"`
	ActivationCheckpoint ActivationCheckpoint `toml:"activation_checkpoint" mapstructure:"activation_checkpoint"`
	Validation           Validation           `toml:"validation" mapstructure:"validation"`
	Comm                 Comm                 `toml:"comm" mapstructure:"comm"`
	Float8               Float8               `toml:"float8" mapstructure:"float8"`
}

// JobSection is the [job] section: where the run writes its outputs and how
// it describes itself. (The Go type is not called Job because the whole
// recipe is.)
type JobSection struct {
	// DumpFolder is the root folder of everything the run writes:
	// checkpoints, traces, TensorBoard logs, the saved config.
	DumpFolder string `toml:"dump_folder" mapstructure:"dump_folder"`
	// Description is a free-form note printed at the start of the run.
	Description string `toml:"description" mapstructure:"description"`
	// PrintConfig prints the resolved recipe at start-up.
	PrintConfig bool `toml:"print_config" mapstructure:"print_config"`
	// SaveConfigFile, when not empty, names a file (relative to DumpFolder)
	// to which the resolved recipe is written. torchtitan uses None for
	// "don't save"; titan uses "".
	SaveConfigFile string `toml:"save_config_file" mapstructure:"save_config_file"`
}

// Profiling is the [profiling] section: periodic execution traces and memory
// snapshots.
type Profiling struct {
	// EnableProfiling turns on periodic trace capture.
	EnableProfiling bool `toml:"enable_profiling" mapstructure:"enable_profiling"`
	// SaveTracesFolder is the trace folder, relative to job.dump_folder.
	SaveTracesFolder string `toml:"save_traces_folder" mapstructure:"save_traces_folder"`
	// ProfileFreq is the number of steps between trace captures.
	ProfileFreq int `toml:"profile_freq" mapstructure:"profile_freq"`
	// ProfilerActive is the number of steps recorded per capture.
	ProfilerActive int `toml:"profiler_active" mapstructure:"profiler_active"`
	// ProfilerWarmup is the number of steps run before recording starts.
	ProfilerWarmup int `toml:"profiler_warmup" mapstructure:"profiler_warmup"`
	// EnableMemorySnapshot records allocator snapshots.
	EnableMemorySnapshot bool `toml:"enable_memory_snapshot" mapstructure:"enable_memory_snapshot"`
	// SaveMemorySnapshotFolder is the snapshot folder, relative to
	// job.dump_folder.
	SaveMemorySnapshotFolder string `toml:"save_memory_snapshot_folder" mapstructure:"save_memory_snapshot_folder"`
}

// Metrics is the [metrics] section: the training log line and its sinks.
type Metrics struct {
	// LogFreq is the number of steps between log lines.
	LogFreq int `toml:"log_freq" mapstructure:"log_freq"`
	// EnableTensorboard writes TensorBoard event files.
	EnableTensorboard bool `toml:"enable_tensorboard" mapstructure:"enable_tensorboard"`
	// DisableColorPrinting prints log lines without terminal colours.
	DisableColorPrinting bool `toml:"disable_color_printing" mapstructure:"disable_color_printing"`
	// SaveTBFolder is the TensorBoard folder, relative to job.dump_folder.
	SaveTBFolder string `toml:"save_tb_folder" mapstructure:"save_tb_folder"`
	// SaveForAllRanks writes metrics from every rank, not only rank 0.
	SaveForAllRanks bool `toml:"save_for_all_ranks" mapstructure:"save_for_all_ranks"`
	// EnableDB records the run — its resolved recipe, layout, status and
	// every logged step — in the run store (package runstore), where
	// `titan runs list|show|compare` find it. Rank 0 records, off the
	// training path. titan only.
	EnableDB bool `toml:"enable_db" mapstructure:"enable_db"`
	// DB is the run store: a SQLite file path (relative to the working
	// directory) or a postgres:// (postgresql://) URL. "" means the
	// TITAN_DB environment variable, else the user's default file
	// (runstore.DefaultPath: $XDG_DATA_HOME/titan/runs.db, by default
	// ~/.local/share/titan/runs.db). titan only.
	DB string `toml:"db" mapstructure:"db"`
}

// Model is the [model] section: which model, at which size, with which
// tokenizer.
type Model struct {
	// Name is the model family, for example "llama3".
	Name string `toml:"name" mapstructure:"name"`
	// Flavor is a named size of the family, for example "debug", "8B".
	// titan's smallest Llama 3 flavor is "debug" (torchtitan: "debugmodel").
	Flavor string `toml:"flavor" mapstructure:"flavor"`
	// TokenizerPath is the tokenizer file or folder; "" selects titan's
	// built-in byte tokenizer.
	TokenizerPath string `toml:"tokenizer_path" mapstructure:"tokenizer_path"`
	// Converters names model transformations applied after construction,
	// in order: [] or ["float8"] (the linear layers compute in float8, see
	// the [float8] section).
	Converters []string `toml:"converters" mapstructure:"converters"`
}

// Optimizer is the [optimizer] section.
type Optimizer struct {
	// Name is "AdamW" or "Adam".
	Name string `toml:"name" mapstructure:"name"`
	// LR is the peak learning rate; the schedule multiplies it by a factor
	// in [min_lr_factor, 1].
	LR float64 `toml:"lr" mapstructure:"lr"`
	// Beta1 is the decay rate of the first-moment estimate.
	Beta1 float64 `toml:"beta1" mapstructure:"beta1"`
	// Beta2 is the decay rate of the second-moment estimate.
	Beta2 float64 `toml:"beta2" mapstructure:"beta2"`
	// Eps is added to the denominator for numerical stability.
	Eps float64 `toml:"eps" mapstructure:"eps"`
	// WeightDecay is the decoupled weight decay (AdamW) or L2 penalty
	// (Adam).
	WeightDecay float64 `toml:"weight_decay" mapstructure:"weight_decay"`
	// Implementation is "fused" (one kernel over all parameters),
	// "foreach" (one kernel per operation over all parameters) or
	// "for-loop" (one parameter at a time).
	Implementation string `toml:"implementation" mapstructure:"implementation"`
}

// LRScheduler is the [lr_scheduler] section: linear warmup, an optional
// stable phase, then decay (torchtitan's warmup-stable-decay schedule; the
// arithmetic lives in the optimizer package).
type LRScheduler struct {
	// WarmupSteps is the length of the linear warmup.
	WarmupSteps int `toml:"warmup_steps" mapstructure:"warmup_steps"`
	// TotalSteps is the schedule's length; nil means training.steps.
	TotalSteps *int `toml:"total_steps,omitempty" mapstructure:"total_steps"`
	// DecayRatio is the fraction of the steps spent decaying; nil means
	// decay starts right after warmup.
	DecayRatio *float64 `toml:"decay_ratio,omitempty" mapstructure:"decay_ratio"`
	// DecayType is "linear", "sqrt" or "cosine".
	DecayType string `toml:"decay_type" mapstructure:"decay_type"`
	// MinLRFactor is the floor of the decay, as a fraction of optimizer.lr.
	MinLRFactor float64 `toml:"min_lr_factor" mapstructure:"min_lr_factor"`
}

// Training is the [training] section: data, batch, length of the run and
// numerics.
type Training struct {
	// Dataset is the kind of corpus at DatasetPath: "text" (plain text
	// files), "jsonl" (JSON lines with a "text" field, optionally
	// gzipped), "tokens" (pre-tokenized files) or "gosrc" (the .go files of
	// the Go distribution, built in). "" detects the kind from DatasetPath,
	// or selects "gosrc" when DatasetPath is "" too. (torchtitan names a
	// registered dataset here, such as "c4"; titan names a format and
	// takes the data from DatasetPath.)
	Dataset string `toml:"dataset" mapstructure:"dataset"`
	// DatasetPath is the file or folder holding the corpus.
	DatasetPath string `toml:"dataset_path" mapstructure:"dataset_path"`
	// LocalBatchSize is the number of sequences per data-parallel rank
	// per micro-step.
	LocalBatchSize int `toml:"local_batch_size" mapstructure:"local_batch_size"`
	// GlobalBatchSize is the number of sequences per optimizer step over
	// all ranks; -1 means local_batch_size × data-parallel degree (no
	// gradient accumulation). Larger values are reached by gradient
	// accumulation.
	GlobalBatchSize int `toml:"global_batch_size" mapstructure:"global_batch_size"`
	// SeqLen is the number of tokens per sequence.
	SeqLen int `toml:"seq_len" mapstructure:"seq_len"`
	// MaxNorm is the global gradient-norm clipping threshold (inf: no
	// clipping).
	MaxNorm float64 `toml:"max_norm" mapstructure:"max_norm"`
	// Steps is the number of optimizer steps of the run.
	Steps int `toml:"steps" mapstructure:"steps"`
	// GradientAccumulationSteps is the number of micro-steps per optimizer
	// step; 0 derives it from global_batch_size (1 when that is -1). titan
	// only; set at most one of the two.
	GradientAccumulationSteps int `toml:"gradient_accumulation_steps" mapstructure:"gradient_accumulation_steps"`
	// Seed seeds parameter initialisation and data order; nil picks a
	// seed at random. (torchtitan TOML era: debug.seed.)
	Seed *int `toml:"seed,omitempty" mapstructure:"seed"`
	// Deterministic asks for bitwise-reproducible kernels where they are
	// slower. (torchtitan TOML era: debug.deterministic.)
	Deterministic bool `toml:"deterministic" mapstructure:"deterministic"`
	// MixedPrecisionParam is the dtype parameters are computed in:
	// "float32" or "bfloat16" (FSDP mixed precision: forward and backward
	// compute with the bfloat16 rounding of the float32 master weights,
	// every linear layer multiplies bfloat16 operands with float32
	// accumulation, the FSDP all-gathers move bfloat16; norms, softmax,
	// the loss and the optimizer stay float32). titan defaults to
	// "float32" (torchtitan: "bfloat16").
	MixedPrecisionParam string `toml:"mixed_precision_param" mapstructure:"mixed_precision_param"`
	// MixedPrecisionReduce is the dtype of the data-parallel gradient
	// reductions (FSDP reduce-scatter, HSDP and DDP all-reduce):
	// "float32" or "bfloat16".
	MixedPrecisionReduce string `toml:"mixed_precision_reduce" mapstructure:"mixed_precision_reduce"`
	// Threads is the number of CPU threads per worker; 0 means all
	// available. titan only.
	Threads int `toml:"threads" mapstructure:"threads"`
	// Device is where the workers compute: "cpu", "cuda" (GPU 0 through
	// the CUDA backend; an error without a usable GPU), or "" for cuda
	// when a GPU is found and cpu otherwise. titan only (torchtitan
	// always trains on the GPU).
	Device string `toml:"device" mapstructure:"device"`
}

// Parallelism is the [parallelism] section: the device mesh. The degrees
// multiply to the number of workers; data_parallel_shard_degree = -1 takes
// whatever the others leave.
type Parallelism struct {
	// DataParallelReplicateDegree is the number of model replicas (DDP,
	// or the replicate dimension of HSDP).
	DataParallelReplicateDegree int `toml:"data_parallel_replicate_degree" mapstructure:"data_parallel_replicate_degree"`
	// DataParallelShardDegree is the FSDP sharding degree; -1 means the
	// remaining workers.
	DataParallelShardDegree int `toml:"data_parallel_shard_degree" mapstructure:"data_parallel_shard_degree"`
	// FSDPReshardAfterForward is "default", "always" or "never": whether
	// FSDP frees gathered parameters after the forward pass ("default":
	// yes, except when pipeline parallelism is on).
	FSDPReshardAfterForward string `toml:"fsdp_reshard_after_forward" mapstructure:"fsdp_reshard_after_forward"`
	// TensorParallelDegree is the tensor-parallel (Megatron-style) degree.
	TensorParallelDegree int `toml:"tensor_parallel_degree" mapstructure:"tensor_parallel_degree"`
	// DisableLossParallel computes the loss on gathered logits instead of
	// on the tensor-parallel shards.
	DisableLossParallel bool `toml:"disable_loss_parallel" mapstructure:"disable_loss_parallel"`
	// EnableAsyncTensorParallel overlaps tensor-parallel communication
	// with matmuls.
	EnableAsyncTensorParallel bool `toml:"enable_async_tensor_parallel" mapstructure:"enable_async_tensor_parallel"`
	// PipelineParallelDegree is the number of pipeline stages' ranks.
	PipelineParallelDegree int `toml:"pipeline_parallel_degree" mapstructure:"pipeline_parallel_degree"`
	// PipelineParallelSchedule is the pipeline schedule, for example
	// "1F1B", "GPipe" or "Interleaved1F1B".
	PipelineParallelSchedule string `toml:"pipeline_parallel_schedule" mapstructure:"pipeline_parallel_schedule"`
	// PipelineParallelMicrobatchSize is the number of sequences per
	// pipeline micro-batch.
	PipelineParallelMicrobatchSize int `toml:"pipeline_parallel_microbatch_size" mapstructure:"pipeline_parallel_microbatch_size"`
	// PipelineParallelLayersPerStage is the number of transformer layers
	// per stage; nil splits the layers evenly over one stage per rank
	// (or two for interleaved schedules).
	PipelineParallelLayersPerStage *int `toml:"pipeline_parallel_layers_per_stage,omitempty" mapstructure:"pipeline_parallel_layers_per_stage"`
	// PipelineParallelFirstStageLessLayers is how many fewer layers the
	// first stage gets, to make room for the embedding.
	PipelineParallelFirstStageLessLayers int `toml:"pipeline_parallel_first_stage_less_layers" mapstructure:"pipeline_parallel_first_stage_less_layers"`
	// PipelineParallelLastStageLessLayers is how many fewer layers the
	// last stage gets, to make room for the output projection and loss.
	PipelineParallelLastStageLessLayers int `toml:"pipeline_parallel_last_stage_less_layers" mapstructure:"pipeline_parallel_last_stage_less_layers"`
	// ContextParallelDegree splits each sequence over this many ranks.
	ContextParallelDegree int `toml:"context_parallel_degree" mapstructure:"context_parallel_degree"`
	// ContextParallelRotateMethod is how key/value shards travel between
	// context-parallel ranks: "allgather" or "alltoall". titan's ring
	// attention passes key/value blocks point to point, torchtitan's
	// "alltoall"; that is the default (torchtitan: "allgather") and the
	// only value titan accepts so far.
	ContextParallelRotateMethod string `toml:"context_parallel_rotate_method" mapstructure:"context_parallel_rotate_method"`
}

// Checkpoint is the [checkpoint] section.
type Checkpoint struct {
	// Enable turns checkpointing (saving and resuming) on.
	Enable bool `toml:"enable" mapstructure:"enable"`
	// Folder is the checkpoint folder, relative to job.dump_folder.
	Folder string `toml:"folder" mapstructure:"folder"`
	// Interval is the number of steps between saves. The last step is
	// always saved.
	Interval int `toml:"interval" mapstructure:"interval"`
	// InitialLoadPath is a checkpoint (or, with InitialLoadInHF, a
	// Hugging Face folder) to start from when Folder holds no full
	// checkpoint; "" means start from scratch. Its weights alone are
	// loaded unless InitialLoadModelOnly is false, and the log says so.
	// It is the only way a model-only checkpoint (other than a seed
	// checkpoint, see CreateSeedCheckpoint) becomes a run's starting
	// point: a Folder holding only model-only checkpoints is otherwise an
	// error.
	InitialLoadPath string `toml:"initial_load_path" mapstructure:"initial_load_path"`
	// InitialLoadModelOnly loads only the model weights from
	// InitialLoadPath (no optimizer state, no step); false loads its full
	// training state (it must be a full checkpoint), as a resume would.
	InitialLoadModelOnly bool `toml:"initial_load_model_only" mapstructure:"initial_load_model_only"`
	// InitialLoadInHF reads InitialLoadPath as a Hugging Face Llama
	// folder (config.json and safetensors); weights only.
	InitialLoadInHF bool `toml:"initial_load_in_hf" mapstructure:"initial_load_in_hf"`
	// LastSaveModelOnly saves only the model weights at the last step.
	// A model-only save never replaces the full state of the same step:
	// when the last step is also an interval step the full state is
	// saved (it holds the model too), so a run started again with more
	// steps resumes it exactly; otherwise a run started again resumes
	// from the newest full checkpoint, passing over (and naming) the
	// newer model-only one. keep_latest_k never removes the newest full
	// checkpoint.
	LastSaveModelOnly bool `toml:"last_save_model_only" mapstructure:"last_save_model_only"`
	// LastSaveInHF also exports the last checkpoint's model as a Hugging
	// Face folder, hf-step-<N> beside it, in ExportDtype (llama3 only).
	LastSaveInHF bool `toml:"last_save_in_hf" mapstructure:"last_save_in_hf"`
	// ExportDtype is the dtype of the Hugging Face export of the last
	// step (LastSaveInHF): "float32" or "bfloat16" (round to nearest
	// even); titan checkpoints themselves hold float32. "float16" is
	// refused.
	ExportDtype string `toml:"export_dtype" mapstructure:"export_dtype"`
	// AsyncMode is "disabled" (the loop waits for each save), "async"
	// (a snapshot in host memory, written in the background; at most one
	// save in flight) or "async_with_pinned_mem" (the same, with snapshot
	// buffers allocated once and reused: on a CPU, pinned memory is host
	// memory).
	AsyncMode string `toml:"async_mode" mapstructure:"async_mode"`
	// KeepLatestK keeps only the newest K checkpoints; 0 keeps all. 1 is
	// not allowed: the newest may still be being written.
	KeepLatestK int `toml:"keep_latest_k" mapstructure:"keep_latest_k"`
	// LoadStep resumes from this step's checkpoint; -1 means the newest.
	LoadStep int `toml:"load_step" mapstructure:"load_step"`
	// ExcludeFromLoading names state (for example "optimizer",
	// "lr_scheduler", "dataloader") not restored on resume.
	ExcludeFromLoading []string `toml:"exclude_from_loading" mapstructure:"exclude_from_loading"`
	// EnableFirstStepCheckpoint also saves after step 1.
	EnableFirstStepCheckpoint bool `toml:"enable_first_step_checkpoint" mapstructure:"enable_first_step_checkpoint"`
	// CreateSeedCheckpoint writes the initial weights as the model-only
	// checkpoint of step 0 and exits (on one process, as torchtitan
	// requires); runs of any layout in the folder then start from it.
	CreateSeedCheckpoint bool `toml:"create_seed_checkpoint" mapstructure:"create_seed_checkpoint"`
	// LoadOnly loads checkpoints but never saves.
	LoadOnly bool `toml:"load_only" mapstructure:"load_only"`
}

// ActivationCheckpoint is the [activation_checkpoint] section: trading
// recomputation for activation memory.
type ActivationCheckpoint struct {
	// Mode is "none", "full" (recompute every layer) or "selective".
	Mode string `toml:"mode" mapstructure:"mode"`
	// SelectiveACOption is, for selective mode, either a positive integer
	// N as a string (checkpoint every N-th layer) or "op" (torchtitan's
	// per-operation policy: keep the attention's outputs and every other
	// matrix product's, recompute the rest; llama.ActivationCheckpoint).
	SelectiveACOption string `toml:"selective_ac_option" mapstructure:"selective_ac_option"`
}

// Validation is the [validation] section: periodic loss on held-out data.
type Validation struct {
	// Enable turns periodic validation on.
	Enable bool `toml:"enable" mapstructure:"enable"`
	// Dataset is the kind of the validation corpus, as training.dataset.
	// With Dataset and DatasetPath both "", validation uses a held-out
	// part of the training corpus (which training then skips).
	Dataset string `toml:"dataset" mapstructure:"dataset"`
	// DatasetPath is the file or folder holding the validation corpus.
	DatasetPath string `toml:"dataset_path" mapstructure:"dataset_path"`
	// LocalBatchSize is the number of sequences per rank per validation
	// step.
	LocalBatchSize int `toml:"local_batch_size" mapstructure:"local_batch_size"`
	// SeqLen is the number of tokens per validation sequence.
	SeqLen int `toml:"seq_len" mapstructure:"seq_len"`
	// Freq is the number of training steps between validations.
	Freq int `toml:"freq" mapstructure:"freq"`
	// Steps is the number of validation batches; -1 means the whole
	// validation set.
	Steps int `toml:"steps" mapstructure:"steps"`
}

// Float8 is the [float8] section: how model.converters = ["float8"]
// converts the linear layers (torchao's Float8Linear, emulated exactly on
// the CPU; see internal/float8).
type Float8 struct {
	// RecipeName is the scaling recipe: "tensorwise", "rowwise" or
	// "rowwise_with_gw_hp".
	RecipeName string `toml:"recipe_name" mapstructure:"recipe_name"`
	// FilterFQNs lists substrings of linear layers' fully qualified names
	// ("output", "layers.0.", "attention.wq") left in high precision.
	FilterFQNs []string `toml:"filter_fqns" mapstructure:"filter_fqns"`
	// EnableFSDPFloat8AllGather casts the float8 layers' weights to e4m3
	// before the FSDP all-gather (tensorwise only): each rank casts its
	// shard with the weight's global scale and the all-gather moves one
	// byte per element.
	EnableFSDPFloat8AllGather bool `toml:"enable_fsdp_float8_all_gather" mapstructure:"enable_fsdp_float8_all_gather"`
	// PrecomputeFloat8DynamicScaleForFSDP computes every float8 weight's
	// scale once per step (after the optimizer step), in one all-reduce,
	// instead of one all-reduce per weight and all-gather; it needs
	// enable_fsdp_float8_all_gather.
	PrecomputeFloat8DynamicScaleForFSDP bool `toml:"precompute_float8_dynamic_scale_for_fsdp" mapstructure:"precompute_float8_dynamic_scale_for_fsdp"`
}

// Float8Config is the float8 conversion of the linear layers that the
// job asks for (model.converters "float8" and [float8]); nil without it.
func (j *Job) Float8Config() (*float8.Config, error) {
	if !slices.Contains(j.Model.Converters, "float8") {
		return nil, nil
	}
	f := j.Float8
	r, err := float8.ParseRecipe(f.RecipeName)
	if err != nil {
		return nil, err
	}
	return &float8.Config{Recipe: r, FilterFQNs: slices.Clone(f.FilterFQNs),
		FSDPAllGather: f.EnableFSDPFloat8AllGather, PrecomputeScales: f.PrecomputeFloat8DynamicScaleForFSDP}, nil
}

// SeqLens are the sequence lengths the job runs its model at:
// training.seq_len, and validation.seq_len when validation is on.
func (j *Job) SeqLens() []int {
	if j.Validation.Enable {
		return []int{j.Training.SeqLen, j.Validation.SeqLen}
	}
	return []int{j.Training.SeqLen}
}

// AccumSteps is the number of micro-batches accumulated per step on
// dataRanks data-parallel ranks: as torchtitan,
// training.global_batch_size / (local_batch_size × dataRanks) when the
// global batch is set, else training.gradient_accumulation_steps (at
// least 1).
func (j *Job) AccumSteps(dataRanks int) (int, error) {
	B := j.Training.LocalBatchSize
	if g := j.Training.GlobalBatchSize; g > 0 {
		per := B * dataRanks
		if per <= 0 || g%per != 0 {
			return 0, fmt.Errorf("training.global_batch_size %d is not a multiple of training.local_batch_size %d × %d data-parallel ranks", g, B, dataRanks)
		}
		return g / per, nil
	}
	return max(j.Training.GradientAccumulationSteps, 1), nil
}

// Comm is the [comm] section: collective-communication timeouts and
// tracing.
type Comm struct {
	// InitTimeoutSeconds bounds rendezvous and the first collectives.
	InitTimeoutSeconds int `toml:"init_timeout_seconds" mapstructure:"init_timeout_seconds"`
	// TrainTimeoutSeconds bounds each collective once training runs.
	TrainTimeoutSeconds int `toml:"train_timeout_seconds" mapstructure:"train_timeout_seconds"`
	// TraceBufSize is the number of collectives kept in the flight
	// recorder; 0 disables it.
	TraceBufSize int `toml:"trace_buf_size" mapstructure:"trace_buf_size"`
	// SaveTracesFolder is the flight-recorder dump folder, relative to
	// job.dump_folder.
	SaveTracesFolder string `toml:"save_traces_folder" mapstructure:"save_traces_folder"`
}

// Default returns the built-in defaults: torchtitan's TOML-era defaults,
// except where titan differs for a reason given in the field's comment
// (model.flavor "debug", training.dataset "", mixed_precision_param
// "float32"). Each call returns a fresh Job.
func Default() *Job {
	return &Job{
		Job: JobSection{
			DumpFolder:  "./outputs",
			Description: "default job",
		},
		Profiling: Profiling{
			SaveTracesFolder:         "profile_traces",
			ProfileFreq:              10,
			ProfilerActive:           1,
			ProfilerWarmup:           3,
			SaveMemorySnapshotFolder: "memory_snapshot",
		},
		Metrics: Metrics{
			LogFreq:      10,
			SaveTBFolder: "tb",
			EnableDB:     true,
		},
		Model: Model{
			Name:       "llama3",
			Flavor:     "debug",
			Converters: []string{},
		},
		Optimizer: Optimizer{
			Name:           "AdamW",
			LR:             8e-4,
			Beta1:          0.9,
			Beta2:          0.95,
			Eps:            1e-8,
			WeightDecay:    0.1,
			Implementation: "fused",
		},
		LRScheduler: LRScheduler{
			WarmupSteps: 200,
			DecayType:   "linear",
		},
		Training: Training{
			LocalBatchSize:       8,
			GlobalBatchSize:      -1,
			SeqLen:               2048,
			MaxNorm:              1.0,
			Steps:                10000,
			MixedPrecisionParam:  "float32",
			MixedPrecisionReduce: "float32",
		},
		Parallelism: Parallelism{
			DataParallelReplicateDegree:          1,
			DataParallelShardDegree:              -1,
			FSDPReshardAfterForward:              "default",
			TensorParallelDegree:                 1,
			PipelineParallelDegree:               1,
			PipelineParallelSchedule:             "1F1B",
			PipelineParallelMicrobatchSize:       1,
			PipelineParallelFirstStageLessLayers: 1,
			PipelineParallelLastStageLessLayers:  1,
			ContextParallelDegree:                1,
			ContextParallelRotateMethod:          "alltoall",
		},
		Checkpoint: Checkpoint{
			Folder:               "checkpoint",
			Interval:             500,
			InitialLoadModelOnly: true,
			LastSaveModelOnly:    true,
			ExportDtype:          "float32",
			AsyncMode:            "disabled",
			KeepLatestK:          10,
			LoadStep:             -1,
			ExcludeFromLoading:   []string{},
		},
		ActivationCheckpoint: ActivationCheckpoint{
			Mode:              "selective",
			SelectiveACOption: "2",
		},
		Validation: Validation{
			LocalBatchSize: 8,
			SeqLen:         2048,
			Freq:           10,
			Steps:          -1,
		},
		Comm: Comm{
			InitTimeoutSeconds:  300,
			TrainTimeoutSeconds: 100,
			TraceBufSize:        20000,
			SaveTracesFolder:    "comm_traces",
		},
		Float8: Float8{
			RecipeName: "tensorwise",
			FilterFQNs: []string{"output"},
		},
	}
}
