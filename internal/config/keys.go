package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// valueKind is the TOML-level type of a recipe key.
type valueKind int

const (
	kindInt valueKind = iota
	kindFloat
	kindString
	kindBool
	kindStrings
)

// want describes a kind for error messages: "want an integer".
func (k valueKind) want() string {
	switch k {
	case kindInt:
		return "an integer"
	case kindFloat:
		return "a number"
	case kindString:
		return "a string"
	case kindBool:
		return "a boolean (true or false)"
	case kindStrings:
		return "an array of strings"
	}
	return "?"
}

// field describes one "section.key" of the recipe.
type field struct {
	key      string // "training.steps"
	section  string // "training"
	name     string // "steps"
	env      string // "TITAN_TRAINING_STEPS"
	index    []int  // reflect field index path from Job
	kind     valueKind
	optional bool // pointer field: nil means "not set"
}

// schema is the recipe's key table, built once from the Job struct's tags.
var schema = buildSchema()

type schemaTable struct {
	fields   []*field          // in declaration order
	byKey    map[string]*field // "section.key" -> field
	byEnv    map[string]*field // "TITAN_SECTION_KEY" -> field
	sections []string          // in declaration order
	isSec    map[string]bool
}

// envPrefix starts every environment variable that sets a recipe key.
const envPrefix = "TITAN_"

func tagName(f reflect.StructField) string {
	tag := f.Tag.Get("toml")
	if i := strings.IndexByte(tag, ','); i >= 0 {
		tag = tag[:i]
	}
	return tag
}

func buildSchema() *schemaTable {
	s := &schemaTable{
		byKey: map[string]*field{},
		byEnv: map[string]*field{},
		isSec: map[string]bool{},
	}
	jt := reflect.TypeOf(Job{})
	for i := 0; i < jt.NumField(); i++ {
		sf := jt.Field(i)
		sec := tagName(sf)
		s.sections = append(s.sections, sec)
		s.isSec[sec] = true
		st := sf.Type
		for k := 0; k < st.NumField(); k++ {
			kf := st.Field(k)
			f := &field{
				section: sec,
				name:    tagName(kf),
				index:   []int{i, k},
			}
			f.key = sec + "." + f.name
			f.env = envPrefix + strings.ToUpper(sec+"_"+f.name)
			t := kf.Type
			if t.Kind() == reflect.Pointer {
				f.optional = true
				t = t.Elem()
			}
			switch {
			case t.Kind() == reflect.Int:
				f.kind = kindInt
			case t.Kind() == reflect.Float64:
				f.kind = kindFloat
			case t.Kind() == reflect.String:
				f.kind = kindString
			case t.Kind() == reflect.Bool:
				f.kind = kindBool
			case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
				f.kind = kindStrings
			default:
				panic(fmt.Sprintf("config: field %s has unsupported type %s", f.key, kf.Type))
			}
			if _, dup := s.byKey[f.key]; dup {
				panic("config: duplicate key " + f.key)
			}
			if _, dup := s.byEnv[f.env]; dup {
				panic("config: duplicate environment variable " + f.env)
			}
			s.fields = append(s.fields, f)
			s.byKey[f.key] = f
			s.byEnv[f.env] = f
		}
	}
	return s
}

// Keys returns every valid "section.key" name, in the order of the Job
// struct (sections in recipe order, keys in section order).
func Keys() []string {
	out := make([]string, len(schema.fields))
	for i, f := range schema.fields {
		out[i] = f.key
	}
	return out
}

// torchtitanOnly lists torchtitan TOML-era keys and sections that titan does
// not implement, so that a torchtitan recipe fails with a message that says
// so instead of a bare "unknown key". A non-empty value names the titan key
// that replaces it.
var torchtitanOnly = map[string]string{
	"job.config_file":                                                    "",
	"job.custom_config_module":                                           "",
	"metrics.enable_wandb":                                               "",
	"model.hf_assets_path":                                               "model.tokenizer_path",
	"model.print_after_conversion":                                       "",
	"optimizer.early_step_in_backward":                                   "",
	"training.enable_cpu_offload":                                        "",
	"training.dtype":                                                     "training.mixed_precision_param",
	"training.gc_freq":                                                   "",
	"training.gc_debug":                                                  "",
	"training.dataloader":                                                "",
	"parallelism.module_fqns_per_model_part":                             "",
	"parallelism.pipeline_parallel_schedule_csv":                         "",
	"parallelism.pipeline_parallel_expert_parallel_overlap":              "",
	"parallelism.context_parallel_load_balancer":                         "",
	"parallelism.expert_parallel_degree":                                 "",
	"parallelism.expert_tensor_parallel_degree":                          "",
	"parallelism.expert_parallel_comm_backend":                           "",
	"checkpoint.enable_ft_dataloader_checkpoints":                        "",
	"checkpoint.initial_load_in_hf_quantized":                            "",
	"activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns": "",
	"activation_checkpoint.early_stop":                                   "",
	"activation_checkpoint.memory_budget":                                "",
	"activation_checkpoint.visualize_memory_budget_pareto":               "",
	"activation_checkpoint.preserve_rng_state":                           "",
	"activation_checkpoint.determinism_check":                            "",
	"activation_checkpoint.debug":                                        "",
	"comm.save_traces_file_prefix":                                       "",
	"comm.mode":                                                          "",
	"validation.dataloader":                                              "",
	"debug.seed":                                                         "training.seed",
	"debug.deterministic":                                                "training.deterministic",
	// Whole sections.
	"compile":           "",
	"quantize":          "",
	"memory_estimation": "",
	"fault_tolerance":   "",
	"experimental":      "",
	"debug":             "",
}

// unknownKeyHint explains an unknown "section.key" (whose section exists):
// a torchtitan-only note, the same key in another section, or the nearest
// key of the section by edit distance.
func unknownKeyHint(key string) string {
	sec, name, _ := strings.Cut(key, ".")
	if repl, ok := torchtitanOnly[key]; ok {
		if repl != "" {
			return fmt.Sprintf("; titan spells it %s", repl)
		}
		return " (a torchtitan key that titan does not implement; remove it)"
	}
	if schema.isSec[name] {
		return fmt.Sprintf("; %s is a section, not a key of [%s] (a key belongs to the [section] header above it)", name, sec)
	}
	// The key exists, but in another section?
	for _, f := range schema.fields {
		if f.name == name && f.section != sec {
			return fmt.Sprintf("; did you mean %s?", f.key)
		}
	}
	var cands []string
	for _, f := range schema.fields {
		if f.section == sec {
			cands = append(cands, f.name)
		}
	}
	if best, ok := nearest(name, cands); ok {
		return fmt.Sprintf("; did you mean %s.%s?", sec, best)
	}
	// Nothing close within the section: try all keys.
	if best, ok := nearest(key, Keys()); ok {
		return fmt.Sprintf("; did you mean %s?", best)
	}
	return fmt.Sprintf("; [%s] has keys %s", sec, strings.Join(cands, ", "))
}

// unknownSectionHint explains an unknown section name.
func unknownSectionHint(sec string) string {
	if _, ok := torchtitanOnly[sec]; ok {
		return " (a torchtitan section that titan does not implement; remove it)"
	}
	if best, ok := nearest(sec, schema.sections); ok {
		return fmt.Sprintf("; did you mean [%s]?", best)
	}
	return "; sections are " + strings.Join(schema.sections, ", ")
}

// bareKeyHint explains a key that sits outside any section (or a --set
// without a section): the sections that have a key of that name, or the
// nearest key.
func bareKeyHint(name string) string {
	var secs []string
	for _, f := range schema.fields {
		if f.name == name {
			secs = append(secs, f.key)
		}
	}
	if len(secs) > 0 {
		return "; did you mean " + strings.Join(secs, " or ") + "?"
	}
	var cands []string
	for _, f := range schema.fields {
		cands = append(cands, f.name)
	}
	if best, ok := nearest(name, cands); ok {
		var keys []string
		for _, f := range schema.fields {
			if f.name == best {
				keys = append(keys, f.key)
			}
		}
		return "; did you mean " + strings.Join(keys, " or ") + "?"
	}
	return ""
}

// nearest returns the candidate closest to s by edit distance (with adjacent
// transpositions counting as one edit), if it is close enough to be a
// plausible typo: at most max(2, len(s)/3) edits. Ties go to the earlier
// candidate.
func nearest(s string, cands []string) (string, bool) {
	best, bestD := "", -1
	for _, c := range cands {
		d := editDistance(s, c)
		if bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	limit := len(s) / 3
	if limit < 2 {
		limit = 2
	}
	if bestD < 0 || bestD > limit {
		return "", false
	}
	return best, true
}

// editDistance is the optimal-string-alignment distance between a and b:
// insertions, deletions, substitutions and transpositions of adjacent bytes
// each cost one.
func editDistance(a, b string) int {
	n, m := len(a), len(b)
	// Three rows: i-2, i-1, i.
	prev2 := make([]int, m+1)
	prev := make([]int, m+1)
	cur := make([]int, m+1)
	for j := 0; j <= m; j++ {
		prev[j] = j
	}
	for i := 1; i <= n; i++ {
		cur[0] = i
		for j := 1; j <= m; j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d := min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d = min(d, prev2[j-2]+1)
			}
			cur[j] = d
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[m]
}

// sortedKeys returns the keys of m in sorted order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
