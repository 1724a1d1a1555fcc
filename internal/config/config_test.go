package config

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/data"
)

// get returns the value of "section.key" in j (dereferencing optional keys;
// nil when unset).
func get(t *testing.T, j *Job, key string) any {
	t.Helper()
	f := schema.byKey[key]
	if f == nil {
		t.Fatalf("no key %s", key)
	}
	v := reflect.ValueOf(j).Elem().FieldByIndex(f.index)
	if f.optional {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	return v.Interface()
}

// writeRecipe writes a recipe into a temporary folder and returns its path.
func writeRecipe(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "r.toml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefault(t *testing.T) {
	// Expected values typed out from the torchtitan key table (reference
	// doc §2.6), with titan's documented deviations marked.
	want := map[string]any{
		"job.dump_folder":                                "./outputs",
		"job.description":                                "default job",
		"job.print_config":                               false,
		"job.save_config_file":                           "",
		"profiling.enable_profiling":                     false,
		"profiling.save_traces_folder":                   "profile_traces",
		"profiling.profile_freq":                         10,
		"profiling.profiler_active":                      1,
		"profiling.profiler_warmup":                      3,
		"metrics.log_freq":                               10,
		"metrics.enable_tensorboard":                     false,
		"metrics.save_tb_folder":                         "tb",
		"model.name":                                     "llama3",
		"model.flavor":                                   "debug", // titan's name for debugmodel
		"model.tokenizer_path":                           "",      // built-in byte tokenizer
		"model.converters":                               []string{},
		"optimizer.name":                                 "AdamW",
		"optimizer.lr":                                   8e-4,
		"optimizer.beta1":                                0.9,
		"optimizer.beta2":                                0.95,
		"optimizer.eps":                                  1e-8,
		"optimizer.weight_decay":                         0.1,
		"optimizer.implementation":                       "fused",
		"lr_scheduler.warmup_steps":                      200,
		"lr_scheduler.total_steps":                       nil,
		"lr_scheduler.decay_ratio":                       nil,
		"lr_scheduler.decay_type":                        "linear",
		"lr_scheduler.min_lr_factor":                     0.0,
		"training.dataset":                               "", // titan: data package default
		"training.dataset_path":                          "",
		"training.local_batch_size":                      8,
		"training.global_batch_size":                     -1,
		"training.seq_len":                               2048,
		"training.max_norm":                              1.0,
		"training.steps":                                 10000,
		"training.gradient_accumulation_steps":           0,
		"training.seed":                                  nil,
		"training.deterministic":                         false,
		"training.mixed_precision_param":                 "float32", // titan: CPU
		"training.threads":                               0,
		"parallelism.data_parallel_replicate_degree":     1,
		"parallelism.data_parallel_shard_degree":         -1,
		"parallelism.fsdp_reshard_after_forward":         "default",
		"parallelism.tensor_parallel_degree":             1,
		"parallelism.disable_loss_parallel":              false,
		"parallelism.enable_async_tensor_parallel":       false,
		"parallelism.pipeline_parallel_degree":           1,
		"parallelism.pipeline_parallel_schedule":         "1F1B",
		"parallelism.pipeline_parallel_microbatch_size":  1,
		"parallelism.pipeline_parallel_layers_per_stage": nil,
		"parallelism.context_parallel_degree":            1,
		"parallelism.context_parallel_rotate_method":     "alltoall", // titan: its ring is point to point
		"checkpoint.enable":                              false,
		"checkpoint.folder":                              "checkpoint",
		"checkpoint.interval":                            500,
		"checkpoint.keep_latest_k":                       10,
		"checkpoint.last_save_model_only":                true,
		"checkpoint.export_dtype":                        "float32",
		"checkpoint.load_step":                           -1,
		"checkpoint.initial_load_path":                   "",
		"checkpoint.initial_load_in_hf":                  false,
		"checkpoint.last_save_in_hf":                     false,
		"checkpoint.async_mode":                          "disabled",
		"checkpoint.exclude_from_loading":                []string{},
		"activation_checkpoint.mode":                     "selective",
		"activation_checkpoint.selective_ac_option":      "2",
		"validation.enable":                              false,
		"validation.dataset":                             "",
		"validation.local_batch_size":                    8,
		"validation.seq_len":                             2048,
		"validation.freq":                                10,
		"validation.steps":                               -1,
		"comm.init_timeout_seconds":                      300,
		"comm.train_timeout_seconds":                     100,
		"comm.trace_buf_size":                            20000,
	}
	d := Default()
	loaded, err := Load("", nil, nil)
	if err != nil {
		t.Fatalf("Load defaults: %v", err)
	}
	for key, w := range want {
		if got := get(t, d, key); !reflect.DeepEqual(got, w) {
			t.Errorf("Default %s = %#v, want %#v", key, got, w)
		}
	}
	if !reflect.DeepEqual(loaded, d) {
		t.Errorf("Load(\"\") differs from Default():\n%+v\n%+v", loaded, d)
	}
	if err := d.Validate(); err != nil {
		t.Errorf("Default().Validate() = %v", err)
	}
	// Each call returns a fresh Job.
	d.Model.Converters = append(d.Model.Converters, "x")
	if len(Default().Model.Converters) != 0 {
		t.Error("Default() shares state between calls")
	}
}

func TestKeys(t *testing.T) {
	keys := Keys()
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] {
			t.Errorf("duplicate key %s", k)
		}
		seen[k] = true
		sec, name, ok := strings.Cut(k, ".")
		if !ok || sec == "" || name == "" || strings.Contains(name, ".") {
			t.Errorf("key %q is not section.key", k)
		}
		if k != strings.ToLower(k) {
			t.Errorf("key %q is not lower case (viper lowercases keys)", k)
		}
	}
	// Every leaf field of Job appears once, with matching toml and
	// mapstructure tags.
	jt := reflect.TypeOf(Job{})
	n := 0
	for i := 0; i < jt.NumField(); i++ {
		sf := jt.Field(i)
		if tagName(sf) != sf.Tag.Get("mapstructure") {
			t.Errorf("section %s: toml tag %q, mapstructure tag %q", sf.Name, tagName(sf), sf.Tag.Get("mapstructure"))
		}
		for k := 0; k < sf.Type.NumField(); k++ {
			kf := sf.Type.Field(k)
			n++
			if tagName(kf) != kf.Tag.Get("mapstructure") {
				t.Errorf("%s.%s: toml tag %q, mapstructure tag %q", sf.Name, kf.Name, tagName(kf), kf.Tag.Get("mapstructure"))
			}
			if !seen[tagName(sf)+"."+tagName(kf)] {
				t.Errorf("field %s.%s missing from Keys()", sf.Name, kf.Name)
			}
		}
	}
	if n != len(keys) {
		t.Errorf("Keys() has %d keys, Job has %d fields", len(keys), n)
	}
	// A key titan implements must not also be listed as torchtitan-only.
	for k := range torchtitanOnly {
		if seen[k] || schema.isSec[k] {
			t.Errorf("%s is both a titan key and in torchtitanOnly", k)
		}
	}
	// Keys returns a copy.
	keys[0] = "x"
	if Keys()[0] == "x" {
		t.Error("Keys() returns shared storage")
	}
}

func TestLayers(t *testing.T) {
	recipe := writeRecipe(t, "[training]\nsteps = 7\nseq_len = 64\n[optimizer]\nlr = 0.01\n")
	tests := []struct {
		name    string
		recipe  string
		environ []string
		sets    []string
		steps   int
		seqLen  int
		lr      float64
	}{
		{"defaults", "", nil, nil, 10000, 2048, 8e-4},
		{"file over defaults", recipe, nil, nil, 7, 64, 0.01},
		{"env over defaults", "", []string{"TITAN_TRAINING_STEPS=8"}, nil, 8, 2048, 8e-4},
		{"env over file", recipe, []string{"TITAN_TRAINING_STEPS=8"}, nil, 8, 64, 0.01},
		{"set over file", recipe, nil, []string{"training.steps=9"}, 9, 64, 0.01},
		{"set over env", recipe, []string{"TITAN_TRAINING_STEPS=8"}, []string{"training.steps=9"}, 9, 64, 0.01},
		{"sets in order", recipe, nil, []string{"training.steps=9", "training.steps=11"}, 11, 64, 0.01},
		{"env float and set int", recipe, []string{"TITAN_OPTIMIZER_LR=0.5"}, []string{"training.seq_len=32"}, 7, 32, 0.5},
		{"unrelated env ignored", recipe, []string{"HOME=/root", "TITAN_RANK=3", "TITAN_WORLD_SIZE=8", "PATH=/bin",
			"TITAN_NUM_THREADS=2", "TITAN_DATA=/x", "TITAN_CKPT_HELPER_DIR=/y", "titan_training_steps=1"}, nil, 7, 64, 0.01},
		{"spaces around numbers", recipe, []string{"TITAN_TRAINING_STEPS= 8 "}, []string{"optimizer.lr = 0.5", " training.seq_len=32"}, 8, 32, 0.5},
		{"env order irrelevant", recipe, []string{"TITAN_TRAINING_SEQ_LEN=16", "TITAN_TRAINING_STEPS=8"}, nil, 8, 16, 0.01},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j, err := Load(tc.recipe, tc.sets, tc.environ)
			if err != nil {
				t.Fatal(err)
			}
			if j.Training.Steps != tc.steps || j.Training.SeqLen != tc.seqLen || j.Optimizer.LR != tc.lr {
				t.Errorf("steps, seq_len, lr = %d, %d, %g; want %d, %d, %g",
					j.Training.Steps, j.Training.SeqLen, j.Optimizer.LR, tc.steps, tc.seqLen, tc.lr)
			}
			// Keys no layer touched keep their defaults.
			if j.Training.LocalBatchSize != 8 || j.Optimizer.Beta2 != 0.95 {
				t.Errorf("untouched keys changed: local_batch_size %d, beta2 %g", j.Training.LocalBatchSize, j.Optimizer.Beta2)
			}
		})
	}
}

func TestLayerKinds(t *testing.T) {
	// Every kind of value through every layer.
	recipe := writeRecipe(t, `
[job]
description = "from file"
print_config = true
[checkpoint]
exclude_from_loading = ["optimizer", "dataloader"]
[lr_scheduler]
decay_ratio = 0.8
total_steps = 100
[training]
seed = 5
max_norm = 2  # an integer is a fine number
`)
	tests := []struct {
		name    string
		environ []string
		sets    []string
		check   func(j *Job) bool
	}{
		{"file", nil, nil, func(j *Job) bool {
			return j.Job.Description == "from file" && j.Job.PrintConfig &&
				reflect.DeepEqual(j.Checkpoint.ExcludeFromLoading, []string{"optimizer", "dataloader"}) &&
				*j.LRScheduler.DecayRatio == 0.8 && *j.LRScheduler.TotalSteps == 100 &&
				*j.Training.Seed == 5 && j.Training.MaxNorm == 2
		}},
		{"env string bool list", []string{"TITAN_JOB_DESCRIPTION=from env", "TITAN_JOB_PRINT_CONFIG=false", "TITAN_CHECKPOINT_EXCLUDE_FROM_LOADING=model, optimizer,train_state"}, nil, func(j *Job) bool {
			return j.Job.Description == "from env" && !j.Job.PrintConfig &&
				reflect.DeepEqual(j.Checkpoint.ExcludeFromLoading, []string{"model", "optimizer", "train_state"})
		}},
		{"set toml list", nil, []string{`checkpoint.exclude_from_loading=["lr_scheduler", "model"]`, "model.converters="}, func(j *Job) bool {
			return reflect.DeepEqual(j.Checkpoint.ExcludeFromLoading, []string{"lr_scheduler", "model"}) &&
				j.Model.Converters != nil && len(j.Model.Converters) == 0
		}},
		{"set empty list", nil, []string{"model.converters="}, func(j *Job) bool {
			return j.Model.Converters != nil && len(j.Model.Converters) == 0
		}},
		{"set value with =", nil, []string{"job.description=a=b"}, func(j *Job) bool {
			return j.Job.Description == "a=b"
		}},
		{"env clears optional", []string{"TITAN_LR_SCHEDULER_DECAY_RATIO=", "TITAN_TRAINING_SEED="}, nil, func(j *Job) bool {
			return j.LRScheduler.DecayRatio == nil && j.Training.Seed == nil && *j.LRScheduler.TotalSteps == 100
		}},
		{"set clears then sets", nil, []string{"training.seed=", "training.seed=9"}, func(j *Job) bool {
			return *j.Training.Seed == 9
		}},
		{"set sets then clears", nil, []string{"training.seed=9", "training.seed="}, func(j *Job) bool {
			return j.Training.Seed == nil
		}},
		{"set optional absent from file", nil, []string{"parallelism.pipeline_parallel_layers_per_stage=4"}, func(j *Job) bool {
			return *j.Parallelism.PipelineParallelLayersPerStage == 4
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j, err := Load(recipe, tc.sets, tc.environ)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(j) {
				s, _ := j.TOML()
				t.Errorf("unexpected result:\n%s", s)
			}
		})
	}
}

// loadErr runs Load and checks the error: its sentinel, and that its message
// contains every string of want.
func loadErr(t *testing.T, recipe string, sets, environ []string, sentinel error, want ...string) {
	t.Helper()
	_, err := Load(recipe, sets, environ)
	if err == nil {
		t.Fatalf("Load succeeded, want an error containing %q", want)
	}
	if !errors.Is(err, sentinel) {
		t.Errorf("error %q does not wrap %v", err, sentinel)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
}

func TestUnknownKey(t *testing.T) {
	typo := writeRecipe(t, "# a typo on line 3\n[training]\nstesp = 5\n")
	wrongSection := writeRecipe(t, "[training]\nwarmup_steps = 5\n")
	torchtitan := writeRecipe(t, "[training]\ngc_freq = 50\n")
	renamed := writeRecipe(t, "[training]\ndtype = \"bfloat16\"\n")
	outside := writeRecipe(t, "steps = 5\n")
	dotted := writeRecipe(t, "training.stesp = 5\n")
	inline := writeRecipe(t, "# inline\n\n\ntraining = { steps = 1, sq_len = 2 }\n[job]\n")
	misplaced := writeRecipe(t, "[job]\ntraining = { steps = 1 }\n")
	upper := writeRecipe(t, "[training]\nSteps = 5\n")
	tests := []struct {
		name    string
		recipe  string
		sets    []string
		environ []string
		want    []string
	}{
		{"file", typo, nil, nil, []string{"unknown key training.stesp in " + typo + ":3; did you mean training.steps?"}},
		{"file other section", wrongSection, nil, nil, []string{"unknown key training.warmup_steps", "did you mean lr_scheduler.warmup_steps?"}},
		{"file torchtitan only", torchtitan, nil, nil, []string{"training.gc_freq", ":2", "torchtitan key that titan does not implement"}},
		{"file torchtitan renamed", renamed, nil, nil, []string{"training.dtype", "titan spells it training.mixed_precision_param"}},
		{"file outside section", outside, nil, nil, []string{"key steps in " + outside + ":1 is outside any section", "did you mean training.steps or validation.steps?"}},
		{"file dotted key", dotted, nil, nil, []string{"unknown key training.stesp in " + dotted + ":1; did you mean training.steps?"}},
		{"file inline table", inline, nil, nil, []string{"unknown key training.sq_len in " + inline + ":4; did you mean training.seq_len?"}},
		{"file section inside section", misplaced, nil, nil, []string{"unknown key job.training in " + misplaced + ":2; training is a section, not a key of [job]"}},
		{"file case matters", upper, nil, nil, []string{"unknown key training.Steps", "did you mean training.steps?"}},
		{"env", "", nil, []string{"TITAN_TRAINING_STESP=5"}, []string{"unknown key training.stesp in environment variable TITAN_TRAINING_STESP; did you mean training.steps (TITAN_TRAINING_STEPS)?"}},
		{"env multiword section", "", nil, []string{"TITAN_LR_SCHEDULER_WARMUP=5"}, []string{"unknown key lr_scheduler.warmup", "did you mean lr_scheduler.warmup_steps"}},
		{"set", "", []string{"training.stesp=5"}, nil, []string{"unknown key training.stesp in --set training.stesp=5; did you mean training.steps?"}},
		{"set no section", "", []string{"steps=5"}, nil, []string{"unknown key steps in --set steps=5: want section.key", "training.steps"}},
		{"set far from anything", "", []string{"training.zzzzzzzzzzzz=1"}, nil, []string{"unknown key training.zzzzzzzzzzzz", "[training] has keys dataset, dataset_path"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			loadErr(t, tc.recipe, tc.sets, tc.environ, ErrUnknownKey, tc.want...)
		})
	}
}

func TestUnknownSection(t *testing.T) {
	typo := writeRecipe(t, "[trainig]\nsteps = 5\n")
	compile := writeRecipe(t, "[job]\n\n[compile]\nenable = false\n")
	float8 := writeRecipe(t, "[quantize.linear.float8]\nemulate = false\n")
	tests := []struct {
		name    string
		recipe  string
		sets    []string
		environ []string
		want    []string
	}{
		{"file", typo, nil, nil, []string{"unknown section [trainig] in " + typo + ":1; did you mean [training]?"}},
		{"file torchtitan", compile, nil, nil, []string{"unknown section [compile] in " + compile + ":3", "torchtitan section that titan does not implement"}},
		{"file torchtitan nested", float8, nil, nil, []string{"unknown section [quantize]", ":1"}},
		{"env", "", nil, []string{"TITAN_TRAINNG_STEPS=5"}, []string{"unknown section in environment variable TITAN_TRAINNG_STEPS; did you mean TITAN_TRAINING_STEPS (training.steps)?"}},
		{"set", "", []string{"trainig.steps=5"}, nil, []string{"unknown section [trainig] in --set trainig.steps=5; did you mean [training]?"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			loadErr(t, tc.recipe, tc.sets, tc.environ, ErrUnknownSection, tc.want...)
		})
	}
}

func TestWrongType(t *testing.T) {
	tests := []struct {
		name    string
		recipe  string // file body; "" for none
		sets    []string
		environ []string
		want    string
	}{
		{"file string for int", "[training]\nsteps = \"ten\"\n", nil, nil, `training.steps = "ten" in %s:2: want an integer`},
		{"file float for int", "[training]\nsteps = 3.5\n", nil, nil, `training.steps = 3.5 in %s:2: want an integer`},
		{"file whole float for int", "[training]\nsteps = 3.0\n", nil, nil, `training.steps = 3.0 in %s:2: want an integer`},
		{"file bool for int", "[training]\nsteps = true\n", nil, nil, `training.steps = true in %s:2: want an integer`},
		{"file int for string", "[model]\nflavor = 8\n", nil, nil, `model.flavor = 8 in %s:2: want a string`},
		{"file string for bool", "[checkpoint]\nenable = \"true\"\n", nil, nil, `checkpoint.enable = "true" in %s:2: want a boolean (true or false)`},
		{"file int for bool", "[checkpoint]\nenable = 1\n", nil, nil, `checkpoint.enable = 1 in %s:2: want a boolean (true or false)`},
		{"file string for float", "[optimizer]\nlr = \"1e-3\"\n", nil, nil, `optimizer.lr = "1e-3" in %s:2: want a number`},
		{"file string for list", "[model]\nconverters = \"float8\"\n", nil, nil, `model.converters = "float8" in %s:2: want an array of strings`},
		{"file ints in list", "[model]\nconverters = [1, 2]\n", nil, nil, `model.converters = [1, 2] in %s:2: want an array of strings`},
		{"file table for int", "[training.steps]\nx = 1\n", nil, nil, `training.steps = {...} in %s:1: want an integer`},
		{"file section not a table", "training = 5\n", nil, nil, `training = 5 in %s:1: want a table ([training])`},
		{"env string for int", "", nil, []string{"TITAN_TRAINING_STEPS=ten"}, `training.steps = "ten" in environment variable TITAN_TRAINING_STEPS: want an integer`},
		{"env float for int", "", nil, []string{"TITAN_TRAINING_STEPS=1.5"}, `training.steps = "1.5" in environment variable TITAN_TRAINING_STEPS: want an integer`},
		{"env word for bool", "", nil, []string{"TITAN_CHECKPOINT_ENABLE=yes"}, `checkpoint.enable = "yes" in environment variable TITAN_CHECKPOINT_ENABLE: want a boolean (true or false)`},
		{"set string for float", "", []string{"optimizer.lr=fast"}, nil, `optimizer.lr = "fast" in --set optimizer.lr=fast: want a number`},
		{"set float for int", "", []string{"training.steps=2.0"}, nil, `training.steps = "2.0" in --set training.steps=2.0: want an integer`},
		{"set empty for required int", "", []string{"training.steps="}, nil, `training.steps = "" in --set training.steps=: want an integer`},
		{"set bad toml list", "", []string{"model.converters=[1]"}, nil, `model.converters = "[1]" in --set model.converters=[1]: want an array of strings`},
		{"set underscore not between digits", "", []string{"training.steps=1__000"}, nil, `training.steps = "1__000" in --set training.steps=1__000: want an integer`},
		{"set trailing underscore", "", []string{"optimizer.lr=1e-3_"}, nil, `optimizer.lr = "1e-3_" in --set optimizer.lr=1e-3_: want a number`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := ""
			want := tc.want
			if tc.recipe != "" {
				path = writeRecipe(t, tc.recipe)
				want = strings.Replace(want, "%s", path, 1)
			}
			loadErr(t, path, tc.sets, tc.environ, ErrType, want)
		})
	}
}

// TestSetUnderscores: --set and TITAN_* take numbers as a recipe file
// writes them, underscores between digits included.
func TestSetUnderscores(t *testing.T) {
	job, err := Load("", []string{"training.steps=1_000", "training.seq_len=4_096", "optimizer.lr=3.141_5e-4"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if job.Training.Steps != 1000 || job.Training.SeqLen != 4096 || job.Optimizer.LR != 3.1415e-4 {
		t.Errorf("steps %d, seq_len %d, lr %g; want 1000, 4096, 3.1415e-4", job.Training.Steps, job.Training.SeqLen, job.Optimizer.LR)
	}
}

func TestMalformedSet(t *testing.T) {
	tests := []struct {
		arg  string
		want string
	}{
		{"training.steps", `malformed --set "training.steps": want section.key=value`},
		{"", `malformed --set "": want section.key=value`},
		{"=5", `malformed --set "=5": no key before '='`},
	}
	for _, tc := range tests {
		t.Run(tc.arg, func(t *testing.T) {
			loadErr(t, "", []string{"training.steps=5", tc.arg}, nil, ErrMalformedSet, tc.want)
		})
	}
}

func TestFileErrorsTogether(t *testing.T) {
	// All problems of a file come back at once, in line order.
	p := writeRecipe(t, "[training]\nsteps = \"x\"\nseqlen = 5\n[optimzer]\nlr = 1\n")
	_, err := Load(p, nil, nil)
	if err == nil {
		t.Fatal("Load succeeded")
	}
	msg := err.Error()
	i1 := strings.Index(msg, p+":2")
	i2 := strings.Index(msg, p+":3")
	i3 := strings.Index(msg, p+":4")
	if i1 < 0 || i2 < 0 || i3 < 0 || !(i1 < i2 && i2 < i3) {
		t.Errorf("want three errors in line order, got:\n%s", msg)
	}
	for _, s := range []error{ErrType, ErrUnknownKey, ErrUnknownSection} {
		if !errors.Is(err, s) {
			t.Errorf("error does not wrap %v", s)
		}
	}
}

func TestLoadOtherErrors(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "missing.toml"), nil, nil); err == nil || !strings.Contains(err.Error(), "missing.toml") {
		t.Errorf("missing file: err = %v", err)
	}
	syntax := writeRecipe(t, "[training]\nsteps = = 5\n")
	if _, err := Load(syntax, nil, nil); err == nil || !strings.Contains(err.Error(), syntax+":2:") {
		t.Errorf("syntax error: err = %v, want it located at %s:2", err, syntax)
	}
	dup := writeRecipe(t, "[training]\nsteps = 1\nsteps = 2\n")
	if _, err := Load(dup, nil, nil); err == nil || !strings.Contains(err.Error(), dup+":3:") {
		t.Errorf("duplicate key: err = %v, want it located at %s:3", err, dup)
	}
	// A valid type but an invalid value is caught by Load's validation.
	loadErr(t, "", []string{"training.steps=0"}, nil, ErrInvalid, "training.steps = 0: must be >= 1", "defaults + --set")
}

func TestTOMLRoundTrip(t *testing.T) {
	seed, tot, lps := 3, 50, 4
	ratio := 0.25
	custom := Default()
	custom.Job.Description = `quotes " and ' and \ and newline
inside`
	custom.Checkpoint.InitialLoadPath = "seed ckpt/with 'quotes'"
	custom.Optimizer.LR = 1.2345678901234567e-7
	custom.Optimizer.Eps = 1e-300
	custom.LRScheduler.DecayRatio = &ratio
	custom.LRScheduler.TotalSteps = &tot
	custom.Training.Seed = &seed
	custom.Training.MaxNorm = 0.1 + 0.2 // not exactly 0.3
	custom.Parallelism.PipelineParallelLayersPerStage = &lps
	custom.Checkpoint.ExcludeFromLoading = []string{"optimizer", "dataloader"}
	custom.Checkpoint.KeepLatestK = 0

	jobs := map[string]*Job{"default": Default(), "custom": custom}
	recipes, _ := filepath.Glob("../../recipes/*.toml")
	for _, r := range recipes {
		j, err := Load(r, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", r, err)
		}
		jobs[filepath.Base(r)] = j
	}
	for name, j := range jobs {
		t.Run(name, func(t *testing.T) {
			s, err := j.TOML()
			if err != nil {
				t.Fatal(err)
			}
			back, err := Load(writeRecipe(t, s), nil, nil)
			if err != nil {
				t.Fatalf("reload: %v\n%s", err, s)
			}
			if !reflect.DeepEqual(back, j) {
				t.Errorf("round trip differs:\n got %+v\nwant %+v\n%s", back, j, s)
			}
			// Every key with a value is written.
			for _, k := range Keys() {
				if get(t, j, k) == nil {
					continue
				}
				_, name, _ := strings.Cut(k, ".")
				if !strings.Contains(s, "\n"+name+" = ") {
					t.Errorf("key %s missing from TOML()", k)
				}
			}
		})
	}
}

func TestRecipes(t *testing.T) {
	// Spot values, typed from the brief and the reference doc §4.2.
	type spot struct {
		flavor     string
		seqLen     int
		localBatch int
		lr         float64
		tp, pp     int
		acMode     string
	}
	want := map[string]spot{
		"llama3_debug.toml":      {"debug", 256, 8, 8e-4, 1, 1, "none"},
		"llama3_tiny_bench.toml": {"tiny_bench", 256, 8, 3e-4, 1, 1, "none"},
		"llama3_8b.toml":         {"8B", 8192, 2, 3e-4, 1, 1, "selective"},
		"llama3_70b.toml":        {"70B", 8192, 16, 1.5e-4, 8, 1, "full"},
		"llama3_405b.toml":       {"405B", 8192, 32, 8e-5, 8, 8, "full"},
	}
	paths, err := filepath.Glob("../../recipes/*.toml")
	if err != nil || len(paths) < len(want) {
		t.Fatalf("found recipes %v (err %v), want at least %d", paths, err, len(want))
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			j, err := Load(p, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := j.Validate(); err != nil {
				t.Fatal(err)
			}
			w, ok := want[filepath.Base(p)]
			if !ok {
				return
			}
			got := spot{j.Model.Flavor, j.Training.SeqLen, j.Training.LocalBatchSize, j.Optimizer.LR,
				j.Parallelism.TensorParallelDegree, j.Parallelism.PipelineParallelDegree, j.ActivationCheckpoint.Mode}
			if got != w {
				t.Errorf("got %+v, want %+v", got, w)
			}
		})
	}
	// The tiny_bench recipe's fixed settings.
	j, err := Load("../../recipes/llama3_tiny_bench.toml", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if j.Optimizer.Name != "AdamW" || j.Optimizer.WeightDecay != 0.1 || j.Training.MixedPrecisionParam != "float32" ||
		j.LRScheduler.WarmupSteps != 0 || j.LRScheduler.DecayRatio == nil || *j.LRScheduler.DecayRatio != 0 {
		t.Errorf("tiny_bench settings changed: %+v %+v %+v", j.Optimizer, j.LRScheduler, j.Training)
	}
	if j, err := Load("../../recipes/llama3_405b.toml", nil, nil); err != nil || j.Parallelism.PipelineParallelSchedule != "Interleaved1F1B" {
		t.Errorf("405b schedule: %v %v", j, err)
	}
}

func TestValidate(t *testing.T) {
	neg := -1
	zero := 0
	tooBig := 1.5
	tests := []struct {
		key    string // the key the error must name
		mutate func(j *Job)
	}{
		{"job.dump_folder", func(j *Job) { j.Job.DumpFolder = "" }},
		{"profiling.profile_freq", func(j *Job) { j.Profiling.ProfileFreq = 0 }},
		{"profiling.profiler_active", func(j *Job) { j.Profiling.ProfilerActive = 0 }},
		{"profiling.profiler_warmup", func(j *Job) { j.Profiling.ProfilerWarmup = -1 }},
		{"profiling.profile_freq", func(j *Job) { j.Profiling.EnableProfiling, j.Profiling.ProfileFreq = true, 3 }}, // < active 1 + warmup 3
		{"profiling.save_traces_folder", func(j *Job) { j.Profiling.EnableProfiling, j.Profiling.SaveTracesFolder = true, "" }},
		{"profiling.save_memory_snapshot_folder", func(j *Job) { j.Profiling.EnableMemorySnapshot, j.Profiling.SaveMemorySnapshotFolder = true, "" }},
		{"metrics.save_tb_folder", func(j *Job) { j.Metrics.EnableTensorboard, j.Metrics.SaveTBFolder = true, "" }},
		{"metrics.log_freq", func(j *Job) { j.Metrics.LogFreq = 0 }},
		{"model.name", func(j *Job) { j.Model.Name = "" }},
		{"model.flavor", func(j *Job) { j.Model.Flavor = "" }},
		{"optimizer.name", func(j *Job) { j.Optimizer.Name = "adamw" }},
		{"optimizer.lr", func(j *Job) { j.Optimizer.LR = 0 }},
		{"optimizer.lr", func(j *Job) { j.Optimizer.LR = -1e-3 }},
		{"optimizer.lr", func(j *Job) { j.Optimizer.LR = nan() }},
		{"optimizer.lr", func(j *Job) { j.Optimizer.LR = inf() }},
		{"optimizer.beta1", func(j *Job) { j.Optimizer.Beta1 = 1 }},
		{"optimizer.beta2", func(j *Job) { j.Optimizer.Beta2 = -0.1 }},
		{"optimizer.eps", func(j *Job) { j.Optimizer.Eps = 0 }},
		{"optimizer.weight_decay", func(j *Job) { j.Optimizer.WeightDecay = -0.1 }},
		{"optimizer.implementation", func(j *Job) { j.Optimizer.Implementation = "fast" }},
		{"lr_scheduler.warmup_steps", func(j *Job) { j.LRScheduler.WarmupSteps = -1 }},
		{"lr_scheduler.total_steps", func(j *Job) { j.LRScheduler.TotalSteps = &zero }},
		{"lr_scheduler.decay_ratio", func(j *Job) { j.LRScheduler.DecayRatio = &tooBig }},
		{"lr_scheduler.decay_type", func(j *Job) { j.LRScheduler.DecayType = "exp" }},
		{"lr_scheduler.min_lr_factor", func(j *Job) { j.LRScheduler.MinLRFactor = 1.1 }},
		{"training.dataset", func(j *Job) { j.Training.Dataset = "c4_test" }},
		{"training.dataset_path", func(j *Job) { j.Training.Dataset = "jsonl" }},
		{"validation.dataset", func(j *Job) { j.Validation.Dataset = "c4_validation" }},
		{"validation.dataset_path", func(j *Job) { j.Validation.Dataset = "tokens" }},
		{"training.local_batch_size", func(j *Job) { j.Training.LocalBatchSize = 0 }},
		{"training.global_batch_size", func(j *Job) { j.Training.GlobalBatchSize = 0 }},
		{"training.global_batch_size", func(j *Job) { j.Training.GlobalBatchSize = -2 }},
		{"training.global_batch_size", func(j *Job) { j.Training.GlobalBatchSize = 12 }}, // not a multiple of 8
		{"training.seq_len", func(j *Job) { j.Training.SeqLen = 0 }},
		{"training.max_norm", func(j *Job) { j.Training.MaxNorm = 0 }},
		{"training.max_norm", func(j *Job) { j.Training.MaxNorm = nan() }},
		{"training.steps", func(j *Job) { j.Training.Steps = 0 }},
		{"training.gradient_accumulation_steps", func(j *Job) { j.Training.GradientAccumulationSteps = -1 }},
		{"training.gradient_accumulation_steps", func(j *Job) {
			j.Training.GradientAccumulationSteps = 2
			j.Training.GlobalBatchSize = 64
		}},
		{"training.seed", func(j *Job) { j.Training.Seed = &neg }},
		{"training.mixed_precision_param", func(j *Job) { j.Training.MixedPrecisionParam = "float16" }},
		{"training.mixed_precision_reduce", func(j *Job) { j.Training.MixedPrecisionReduce = "float16" }},
		{"float8.recipe_name", func(j *Job) { j.Float8.RecipeName = "blockwise" }},
		{"float8.enable_fsdp_float8_all_gather", func(j *Job) {
			j.Model.Converters = []string{"float8"}
			j.Float8.RecipeName = "rowwise"
			j.Float8.EnableFSDPFloat8AllGather = true
		}},
		{"float8.precompute_float8_dynamic_scale_for_fsdp", func(j *Job) { j.Float8.PrecomputeFloat8DynamicScaleForFSDP = true }},
		{"float8.enable_fsdp_float8_all_gather", func(j *Job) { j.Float8.EnableFSDPFloat8AllGather = true }},
		{"training.threads", func(j *Job) { j.Training.Threads = -1 }},
		{"parallelism.data_parallel_replicate_degree", func(j *Job) { j.Parallelism.DataParallelReplicateDegree = -1 }},
		{"parallelism.data_parallel_shard_degree", func(j *Job) { j.Parallelism.DataParallelShardDegree = 0 }},
		{"parallelism.data_parallel_shard_degree", func(j *Job) { j.Parallelism.DataParallelShardDegree = -2 }},
		{"parallelism.fsdp_reshard_after_forward", func(j *Job) { j.Parallelism.FSDPReshardAfterForward = "sometimes" }},
		{"parallelism.tensor_parallel_degree", func(j *Job) { j.Parallelism.TensorParallelDegree = 0 }},
		{"parallelism.pipeline_parallel_degree", func(j *Job) { j.Parallelism.PipelineParallelDegree = -1 }},
		{"parallelism.pipeline_parallel_schedule", func(j *Job) { j.Parallelism.PipelineParallelSchedule = "2F2B" }},
		{"parallelism.pipeline_parallel_microbatch_size", func(j *Job) { j.Parallelism.PipelineParallelMicrobatchSize = 0 }},
		{"parallelism.pipeline_parallel_layers_per_stage", func(j *Job) { j.Parallelism.PipelineParallelLayersPerStage = &zero }},
		{"parallelism.pipeline_parallel_first_stage_less_layers", func(j *Job) { j.Parallelism.PipelineParallelFirstStageLessLayers = -1 }},
		{"parallelism.pipeline_parallel_last_stage_less_layers", func(j *Job) { j.Parallelism.PipelineParallelLastStageLessLayers = -1 }},
		{"parallelism.context_parallel_degree", func(j *Job) { j.Parallelism.ContextParallelDegree = 0 }},
		{"parallelism.context_parallel_rotate_method", func(j *Job) { j.Parallelism.ContextParallelRotateMethod = "ring" }},
		{"checkpoint.folder", func(j *Job) { j.Checkpoint.Folder = "" }},
		{"checkpoint.interval", func(j *Job) { j.Checkpoint.Interval = 0 }},
		{"checkpoint.export_dtype", func(j *Job) { j.Checkpoint.ExportDtype = "int8" }},
		{"checkpoint.async_mode", func(j *Job) { j.Checkpoint.AsyncMode = "sync" }},
		{"checkpoint.keep_latest_k", func(j *Job) { j.Checkpoint.KeepLatestK = 1 }},
		{"checkpoint.keep_latest_k", func(j *Job) { j.Checkpoint.KeepLatestK = -1 }},
		{"checkpoint.load_step", func(j *Job) { j.Checkpoint.LoadStep = -2 }},
		{"checkpoint.exclude_from_loading", func(j *Job) { j.Checkpoint.ExcludeFromLoading = []string{""} }},
		{"checkpoint.exclude_from_loading", func(j *Job) { j.Checkpoint.ExcludeFromLoading = []string{"optimizer", "scheduler"} }},
		{"activation_checkpoint.mode", func(j *Job) { j.ActivationCheckpoint.Mode = "memory_budget" }},
		{"activation_checkpoint.selective_ac_option", func(j *Job) { j.ActivationCheckpoint.SelectiveACOption = "0" }},
		{"activation_checkpoint.selective_ac_option", func(j *Job) { j.ActivationCheckpoint.SelectiveACOption = "ops" }},
		{"validation.local_batch_size", func(j *Job) { j.Validation.LocalBatchSize = 0 }},
		{"validation.seq_len", func(j *Job) { j.Validation.SeqLen = 0 }},
		{"validation.freq", func(j *Job) { j.Validation.Freq = 0 }},
		{"validation.steps", func(j *Job) { j.Validation.Steps = 0 }},
		{"comm.init_timeout_seconds", func(j *Job) { j.Comm.InitTimeoutSeconds = 0 }},
		{"comm.train_timeout_seconds", func(j *Job) { j.Comm.TrainTimeoutSeconds = 0 }},
		{"comm.trace_buf_size", func(j *Job) { j.Comm.TraceBufSize = -1 }},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			j := Default()
			tc.mutate(j)
			err := j.Validate()
			if err == nil {
				t.Fatal("Validate accepted the bad value")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %q does not wrap ErrInvalid", err)
			}
			keys := invalidKeys(err)
			if len(keys) != 1 || keys[0] != tc.key {
				t.Errorf("error names keys %v, want exactly [%s]: %v", keys, tc.key, err)
			}
			if !strings.HasPrefix(err.Error(), tc.key+" = ") {
				t.Errorf("message %q does not start with %q", err, tc.key+" = ")
			}
		})
	}

	// Edge values that are allowed.
	ok := []func(j *Job){
		func(j *Job) { j.Checkpoint.KeepLatestK = 0 },
		func(j *Job) { j.Checkpoint.KeepLatestK = 2 },
		func(j *Job) { j.LRScheduler.WarmupSteps = 0 },
		func(j *Job) { j.LRScheduler.DecayRatio = new(float64) },
		func(j *Job) { j.LRScheduler.MinLRFactor = 1 },
		func(j *Job) { j.Training.GlobalBatchSize = 64 },
		func(j *Job) { j.Training.GradientAccumulationSteps = 4 },
		func(j *Job) { j.Training.MaxNorm = inf() },
		func(j *Job) { j.Parallelism.PipelineParallelSchedule = "interleaved1f1b" },
		func(j *Job) { j.ActivationCheckpoint.SelectiveACOption = "op" },
		func(j *Job) { j.Optimizer.WeightDecay = 0 },
		func(j *Job) { j.Checkpoint.LoadStep = 0 },
		func(j *Job) { j.Training.Dataset = "gosrc" },
		func(j *Job) { j.Training.DatasetPath = "corpus/" },
		func(j *Job) { j.Training.Dataset, j.Training.DatasetPath = "text", "a.txt" },
	}
	for i, m := range ok {
		j := Default()
		m(j)
		if err := j.Validate(); err != nil {
			t.Errorf("allowed value %d rejected: %v", i, err)
		}
	}

	// All problems are reported together.
	j := Default()
	j.Training.Steps = 0
	j.Optimizer.LR = 0
	j.Checkpoint.KeepLatestK = 1
	if keys := invalidKeys(j.Validate()); len(keys) != 3 {
		t.Errorf("want 3 problems, got %v", keys)
	}
}

func TestDatasetKindsMatchData(t *testing.T) {
	// Validate's list of dataset kinds must follow package data's.
	want := []string{"", data.KindText, data.KindJSONL, data.KindTokens, data.KindGoSrc}
	if !slices.Equal(datasetKinds, want) {
		t.Errorf("datasetKinds = %q, package data has %q", datasetKinds, want)
	}
}

// invalidKeys lists the keys of the *KeyError values joined in err.
func invalidKeys(err error) []string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		if ke, ok := e.(*KeyError); ok {
			out = append(out, ke.Key)
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

func nan() float64 { z := 0.0; return z / z }
func inf() float64 { z := 0.0; return 1 / z }

// naiveDistance is the restricted Damerau-Levenshtein distance by plain
// recursion over suffixes: an independent reference for editDistance.
func naiveDistance(a, b string) int {
	if a == "" {
		return len(b)
	}
	if b == "" {
		return len(a)
	}
	cost := 1
	if a[0] == b[0] {
		cost = 0
	}
	d := min(naiveDistance(a[1:], b)+1, naiveDistance(a, b[1:])+1, naiveDistance(a[1:], b[1:])+cost)
	if len(a) > 1 && len(b) > 1 && a[0] == b[1] && a[1] == b[0] {
		d = min(d, naiveDistance(a[2:], b[2:])+1)
	}
	return d
}

func TestEditDistance(t *testing.T) {
	fixed := []struct {
		a, b string
		d    int
	}{
		{"", "", 0}, {"abc", "", 3}, {"", "ab", 2},
		{"steps", "steps", 0}, {"stesp", "steps", 1}, {"seqlen", "seq_len", 1},
		{"trainig", "training", 1}, {"kitten", "sitting", 3}, {"ca", "abc", 3},
	}
	for _, tc := range fixed {
		if got := editDistance(tc.a, tc.b); got != tc.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.d)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	word := func() string {
		b := make([]byte, r.IntN(7))
		for i := range b {
			b[i] = "abc_"[r.IntN(4)]
		}
		return string(b)
	}
	for i := 0; i < 2000; i++ {
		a, b := word(), word()
		if got, want := editDistance(a, b), naiveDistance(a, b); got != want {
			t.Fatalf("editDistance(%q, %q) = %d, naive %d", a, b, got, want)
		}
	}
}

// TestUnsupportedValuesAreRefused: every torchtitan value that titan does
// not implement yet is refused by Validate with a message that names the
// key, says "not supported yet" and names the value titan accepts; and the
// accepted value passes.
func TestUnsupportedValuesAreRefused(t *testing.T) {
	tests := []struct {
		key      string
		set      func(j *Job)
		accepted string
	}{
		{"model.converters", func(j *Job) { j.Model.Converters = []string{"mx"} }, `["float8"]`},
		{"model.converters", func(j *Job) { j.Model.Converters = []string{"float8", "float8"} }, `["float8"]`},
		{"checkpoint.export_dtype", func(j *Job) { j.Checkpoint.ExportDtype = "float16" }, `"float32" and "bfloat16"`},
		{"parallelism.context_parallel_rotate_method", func(j *Job) { j.Parallelism.ContextParallelRotateMethod = "allgather" }, `"alltoall"`},
		{"parallelism.enable_async_tensor_parallel", func(j *Job) { j.Parallelism.EnableAsyncTensorParallel = true }, "false"},
		{"parallelism.pipeline_parallel_schedule", func(j *Job) { j.Parallelism.PipelineParallelSchedule = "DualPipeV" }, `"1F1B"`},
		{"parallelism.pipeline_parallel_schedule", func(j *Job) { j.Parallelism.PipelineParallelSchedule = "dualpipev" }, `"ZBVZeroBubble"`},
	}
	if err := Default().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			j := Default()
			tc.set(j)
			err := j.Validate()
			if err == nil {
				t.Fatal("accepted")
			}
			var ke *KeyError
			if !errors.As(err, &ke) || ke.Key != tc.key || !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v: want a KeyError for %s", err, tc.key)
			}
			for _, want := range []string{tc.key, "not supported yet", tc.accepted} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		})
	}
}

// TestCheckpointKeyCombinations: the checkpoint keys that only make sense
// together are refused apart, naming the key and what it needs; the
// combinations that work pass.
func TestCheckpointKeyCombinations(t *testing.T) {
	for _, tc := range []struct {
		key  string
		set  func(c *Checkpoint)
		want string // "" : accepted
	}{
		{"checkpoint.export_dtype", func(c *Checkpoint) { c.ExportDtype = "bfloat16" }, "last_save_in_hf"},
		{"", func(c *Checkpoint) { c.ExportDtype = "bfloat16"; c.LastSaveInHF = true }, ""},
		{"checkpoint.initial_load_in_hf", func(c *Checkpoint) { c.InitialLoadInHF = true }, "initial_load_path"},
		{"checkpoint.initial_load_model_only", func(c *Checkpoint) { c.InitialLoadInHF, c.InitialLoadPath, c.InitialLoadModelOnly = true, "hf", false }, "weights only"},
		{"", func(c *Checkpoint) { c.InitialLoadInHF, c.InitialLoadPath = true, "hf" }, ""},
		{"", func(c *Checkpoint) { c.InitialLoadModelOnly, c.InitialLoadPath = false, "ck" }, ""},
		{"checkpoint.create_seed_checkpoint", func(c *Checkpoint) { c.CreateSeedCheckpoint, c.Enable = true, false }, "checkpoint.enable"},
		{"", func(c *Checkpoint) { c.CreateSeedCheckpoint, c.Enable = true, true }, ""},
		{"", func(c *Checkpoint) { c.AsyncMode = "async" }, ""},
		{"", func(c *Checkpoint) { c.AsyncMode = "async_with_pinned_mem" }, ""},
		{"", func(c *Checkpoint) { c.LoadOnly, c.EnableFirstStepCheckpoint = true, true }, ""},
	} {
		j := Default()
		tc.set(&j.Checkpoint)
		err := j.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", j.Checkpoint, err)
			}
			continue
		}
		var ke *KeyError
		if err == nil || !errors.As(err, &ke) || ke.Key != tc.key || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want a KeyError naming it and %q", tc.key, err, tc.want)
		}
	}
}

// TestExcludeFromLoadingNames: the five torchtitan state names pass; any
// other is refused with the nearest valid one suggested.
func TestExcludeFromLoadingNames(t *testing.T) {
	j := Default()
	j.Checkpoint.ExcludeFromLoading = []string{"model", "optimizer", "lr_scheduler", "dataloader", "train_state"}
	if err := j.Validate(); err != nil {
		t.Fatalf("valid names refused: %v", err)
	}
	for _, tc := range []struct{ name, hint string }{
		{"optimiser", `did you mean "optimizer"?`},
		{"data_loader", `did you mean "dataloader"?`},
		{"lr_schedule", `did you mean "lr_scheduler"?`},
		{"weights", `"model", "optimizer"`},
	} {
		j.Checkpoint.ExcludeFromLoading = []string{"model", tc.name}
		err := j.Validate()
		if err == nil {
			t.Errorf("%q accepted", tc.name)
			continue
		}
		for _, want := range []string{"checkpoint.exclude_from_loading", strconv.Quote(tc.name), tc.hint} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q lacks %q", err, want)
			}
		}
	}
}

// TestSaveRoundTrip: Save writes a recipe that Load reads back to an equal
// Job, replaces an existing file whole, and leaves no temporary file.
func TestSaveRoundTrip(t *testing.T) {
	seed, ratio := 11, 0.5
	j := Default()
	j.Job.DumpFolder = t.TempDir()
	j.Job.SaveConfigFile = "sub/config.toml"
	j.Job.Description = "saved \"run\""
	j.Training.Seed = &seed
	j.LRScheduler.DecayRatio = &ratio
	j.Checkpoint.ExcludeFromLoading = []string{"dataloader"}
	path := j.SavePath()
	if want := filepath.Join(j.Job.DumpFolder, "sub", "config.toml"); path != want {
		t.Fatalf("SavePath = %q, want %q", path, want)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := j.SaveConfigFile(); err != nil {
		t.Fatal(err)
	}
	back, err := Load(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, j) {
		t.Errorf("loaded back:\n%+v\nwant\n%+v", back, j)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("folder holds %d entries, want only config.toml", len(entries))
	}
	j.Job.SaveConfigFile = ""
	if j.SavePath() != "" || j.SaveConfigFile() != nil {
		t.Error("empty job.save_config_file must write nothing")
	}
}
