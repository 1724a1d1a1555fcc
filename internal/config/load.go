package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	toml "github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
	"github.com/spf13/viper"
)

// Sentinel errors; every error Load and Validate return about a key wraps
// one of them (test with errors.Is; a Load error may join several).
var (
	// ErrUnknownKey: a key that is not in Keys().
	ErrUnknownKey = errors.New("unknown key")
	// ErrUnknownSection: a section that titan does not have.
	ErrUnknownSection = errors.New("unknown section")
	// ErrType: a value of the wrong type for its key.
	ErrType = errors.New("wrong type")
	// ErrMalformedSet: a --set argument that is not section.key=value.
	ErrMalformedSet = errors.New("malformed --set")
	// ErrInvalid: a value of the right type that is out of range or not
	// one of the allowed choices (reported by Validate).
	ErrInvalid = errors.New("invalid value")
)

// A KeyError reports a problem with one key. Its message is complete on its
// own, for example
//
//	unknown key training.stesp in recipes/x.toml:7; did you mean training.steps?
type KeyError struct {
	// Key is the offending "section.key" (or section, or raw --set
	// argument).
	Key string
	// Source says where the key came from: "recipes/x.toml:7",
	// "environment variable TITAN_TRAINING_STEPS",
	// "--set training.steps=ten", or "" for Validate.
	Source string
	// Err is one of the sentinel errors.
	Err error
	msg string
}

// Error returns the full message.
func (e *KeyError) Error() string { return e.msg }

// Unwrap returns the sentinel error.
func (e *KeyError) Unwrap() error { return e.Err }

func keyErr(sentinel error, key, source, format string, args ...any) *KeyError {
	return &KeyError{Key: key, Source: source, Err: sentinel, msg: fmt.Sprintf(format, args...)}
}

// Load resolves a Job from the built-in defaults, the recipe file at
// recipePath ("" for none), the TITAN_<SECTION>_<KEY> variables of environ
// (pass os.Environ()) and the --set overrides in sets ("section.key=value",
// applied in order), each layer overriding the ones before, and validates
// the result.
//
// All unknown keys, unknown sections and wrongly typed values of the recipe
// file are reported together, each with its line; environment and --set
// problems are reported as found. A TITAN_ variable that names no section is
// left alone, since other parts of titan (the launcher) share the prefix,
// unless its name is within a typo of a recipe variable.
//
// Values given as strings (environment, --set) are parsed by the key's type:
// integers and numbers as Go literals, booleans as true/false/1/0, arrays of
// strings as a TOML array (["a", "b"]) or comma-separated (a,b). An empty
// value clears an optional key.
func Load(recipePath string, sets []string, environ []string) (*Job, error) {
	v := viper.New()
	setDefaults(v)

	sources := "defaults"
	if recipePath != "" {
		data, err := os.ReadFile(recipePath)
		if err != nil {
			return nil, fmt.Errorf("config: read recipe: %w", err)
		}
		if err := checkRecipe(recipePath, data); err != nil {
			return nil, err
		}
		v.SetConfigType("toml")
		if err := v.ReadConfig(bytes.NewReader(data)); err != nil {
			return nil, fmt.Errorf("config: recipe %s: %w", recipePath, err)
		}
		sources = recipePath
	}

	cleared := map[string]bool{}
	apply := func(o override) {
		if o.clear {
			cleared[o.f.key] = true
			return
		}
		delete(cleared, o.f.key)
		v.Set(o.f.key, o.value)
	}
	envs, err := envOverrides(environ)
	if err != nil {
		return nil, err
	}
	for _, o := range envs {
		apply(o)
	}
	if len(envs) > 0 {
		sources += " + environment"
	}
	for _, s := range sets {
		o, err := setOverride(s)
		if err != nil {
			return nil, err
		}
		apply(o)
	}
	if len(sets) > 0 {
		sources += " + --set"
	}

	job := &Job{}
	strict := func(c *mapstructure.DecoderConfig) {
		c.WeaklyTypedInput = false
		c.ErrorUnused = true
	}
	if err := v.Unmarshal(job, strict); err != nil {
		return nil, fmt.Errorf("config: decode %s: %w", sources, err)
	}
	rv := reflect.ValueOf(job).Elem()
	for key := range cleared {
		fv := rv.FieldByIndex(schema.byKey[key].index)
		fv.Set(reflect.Zero(fv.Type()))
	}
	normalize(job)
	if err := job.Validate(); err != nil {
		return nil, fmt.Errorf("config: invalid recipe (%s):\n%w", sources, err)
	}
	return job, nil
}

// setDefaults hands Default() to viper, key by key. Optional keys have no
// default.
func setDefaults(v *viper.Viper) {
	def := reflect.ValueOf(Default()).Elem()
	for _, f := range schema.fields {
		fv := def.FieldByIndex(f.index)
		if f.optional {
			if fv.IsNil() {
				continue
			}
			fv = fv.Elem()
		}
		v.SetDefault(f.key, fv.Interface())
	}
}

// normalize replaces nil string slices by empty ones, so that a Job compares
// equal whichever way it was produced.
func normalize(j *Job) {
	rv := reflect.ValueOf(j).Elem()
	for _, f := range schema.fields {
		if f.kind != kindStrings {
			continue
		}
		fv := rv.FieldByIndex(f.index)
		if fv.IsNil() {
			fv.Set(reflect.MakeSlice(fv.Type(), 0, 0))
		}
	}
}

// TOML returns the Job as a recipe: every key with its value (optional keys
// only when set). Load reads it back to an equal Job.
func (j *Job) TOML() (string, error) {
	b, err := toml.Marshal(j)
	if err != nil {
		return "", fmt.Errorf("config: encode recipe: %w", err)
	}
	const header = "# titan recipe, fully resolved: every key with its value.\n\n"
	return header + string(b), nil
}

// override is one checked environment or --set value.
type override struct {
	f     *field
	value any  // typed: int, float64, string, bool or []string
	clear bool // set an optional key back to nil
}

// envOverrides returns the recipe values among environ, sorted by variable
// name so that the result does not depend on the environment's order.
func envOverrides(environ []string) ([]override, error) {
	var out []override
	names := map[string]string{}
	for _, kv := range environ {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, envPrefix) {
			continue
		}
		names[name] = val
	}
	for _, name := range sortedKeys(names) {
		val := names[name]
		src := "environment variable " + name
		f := schema.byEnv[name]
		if f == nil {
			if err := unknownEnv(name, src); err != nil {
				return nil, err
			}
			continue
		}
		o, err := parseOverride(f, val, src)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

// unknownEnv decides whether a TITAN_ variable that is not a recipe key is an
// error: it is when it starts with a known section, or when it is within a
// typo of a recipe variable; otherwise it belongs to someone else.
func unknownEnv(name, src string) error {
	rest := name[len(envPrefix):]
	for _, sec := range schema.sections {
		p := strings.ToUpper(sec) + "_"
		if strings.HasPrefix(rest, p) && len(rest) > len(p) {
			key := sec + "." + strings.ToLower(rest[len(p):])
			return keyErr(ErrUnknownKey, key, src, "unknown key %s in %s%s", key, src, envHint(key))
		}
	}
	var cands []string
	for _, f := range schema.fields {
		cands = append(cands, f.env[len(envPrefix):])
	}
	if best, ok := nearest(rest, cands); ok {
		f := schema.byEnv[envPrefix+best]
		return keyErr(ErrUnknownSection, strings.ToLower(rest), src,
			"unknown section in %s; did you mean %s (%s)?", src, f.env, f.key)
	}
	return nil
}

// envHint is unknownKeyHint with the suggestion also spelled as a variable.
func envHint(key string) string {
	h := unknownKeyHint(key)
	for _, f := range schema.fields {
		if strings.Contains(h, " "+f.key+"?") {
			return strings.Replace(h, " "+f.key+"?", " "+f.key+" ("+f.env+")?", 1)
		}
	}
	return h
}

// setOverride checks one --set argument.
func setOverride(arg string) (override, error) {
	src := "--set " + arg
	key, val, ok := strings.Cut(arg, "=")
	key = strings.TrimSpace(key)
	if !ok {
		return override{}, keyErr(ErrMalformedSet, arg, src,
			"malformed --set %q: want section.key=value", arg)
	}
	if key == "" {
		return override{}, keyErr(ErrMalformedSet, arg, src,
			"malformed --set %q: no key before '='; want section.key=value", arg)
	}
	f := schema.byKey[key]
	if f == nil {
		sec, _, dotted := strings.Cut(key, ".")
		switch {
		case !dotted:
			return override{}, keyErr(ErrUnknownKey, key, src,
				"unknown key %s in %s: want section.key%s", key, src, bareKeyHint(key))
		case !schema.isSec[sec]:
			return override{}, keyErr(ErrUnknownSection, sec, src,
				"unknown section [%s] in %s%s", sec, src, unknownSectionHint(sec))
		default:
			return override{}, keyErr(ErrUnknownKey, key, src,
				"unknown key %s in %s%s", key, src, unknownKeyHint(key))
		}
	}
	return parseOverride(f, val, src)
}

// tomlValue parses t as a recipe file's TOML value of f's kind (numbers
// with underscores, lists).
func tomlValue(f *field, t string) (any, bool) {
	var m map[string]any
	if err := toml.Unmarshal([]byte("v = "+t), &m); err != nil {
		return nil, false
	}
	return checkValue(f, m["v"])
}

// parseOverride parses a string value by the type of f.
func parseOverride(f *field, s, src string) (override, error) {
	o := override{f: f}
	if f.optional && s == "" {
		o.clear = true
		return o, nil
	}
	bad := func() (override, error) {
		return override{}, keyErr(ErrType, f.key, src, "%s = %q in %s: want %s", f.key, s, src, f.kind.want())
	}
	t := strings.TrimSpace(s) // for numbers, booleans and lists
	switch f.kind {
	case kindInt:
		n, err := strconv.ParseInt(t, 10, strconv.IntSize)
		if err != nil {
			v, ok := tomlValue(f, t) // as a recipe file writes it: 4_096
			if !ok {
				return bad()
			}
			n = int64(v.(int))
		}
		o.value = int(n)
	case kindFloat:
		x, err := strconv.ParseFloat(t, 64)
		if err != nil {
			v, ok := tomlValue(f, t)
			if !ok {
				return bad()
			}
			x = v.(float64)
		}
		o.value = x
	case kindBool:
		b, err := strconv.ParseBool(t)
		if err != nil {
			return bad()
		}
		o.value = b
	case kindString:
		o.value = s
	case kindStrings:
		switch {
		case t == "":
			o.value = []string{}
		case strings.HasPrefix(t, "["):
			v, ok := tomlValue(f, t)
			if !ok {
				return bad()
			}
			o.value = v
		default:
			parts := strings.Split(t, ",")
			for i := range parts {
				parts[i] = strings.TrimSpace(parts[i])
			}
			o.value = parts
		}
	}
	return o, nil
}

// checkValue converts a value decoded from TOML to f's Go type, reporting
// false when the TOML type does not fit. Integers are accepted for numbers;
// numbers are not accepted for integers, not even 3.0.
func checkValue(f *field, v any) (any, bool) {
	switch f.kind {
	case kindInt:
		if n, ok := v.(int64); ok && int64(int(n)) == n {
			return int(n), true
		}
	case kindFloat:
		switch x := v.(type) {
		case float64:
			return x, true
		case int64:
			return float64(x), true
		}
	case kindString:
		if s, ok := v.(string); ok {
			return s, true
		}
	case kindBool:
		if b, ok := v.(bool); ok {
			return b, true
		}
	case kindStrings:
		arr, ok := v.([]any)
		if !ok {
			return nil, false
		}
		out := make([]string, len(arr))
		for i, e := range arr {
			s, ok := e.(string)
			if !ok {
				return nil, false
			}
			out[i] = s
		}
		return out, true
	}
	return nil, false
}

// checkRecipe parses a recipe file and reports every unknown section,
// unknown key and wrongly typed value in it, sorted by line.
func checkRecipe(path string, data []byte) error {
	var raw map[string]any
	if err := toml.Unmarshal(data, &raw); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return fmt.Errorf("config: recipe %s:%d:%d: %w", path, row, col, err)
		}
		return fmt.Errorf("config: recipe %s: %w", path, err)
	}
	lines := keyLines(data)
	type located struct {
		line int
		err  *KeyError
	}
	var errs []located
	report := func(path2 string, e *KeyError) {
		errs = append(errs, located{lines[path2], e})
	}
	where := func(p string) string {
		if n := lines[p]; n > 0 {
			return fmt.Sprintf("%s:%d", path, n)
		}
		return path
	}
	for _, sec := range sortedKeys(raw) {
		val := raw[sec]
		body, isTable := val.(map[string]any)
		src := where(sec)
		switch {
		case !schema.isSec[sec] && isTable:
			report(sec, keyErr(ErrUnknownSection, sec, src,
				"unknown section [%s] in %s%s", sec, src, unknownSectionHint(sec)))
			continue
		case !schema.isSec[sec]:
			report(sec, keyErr(ErrUnknownKey, sec, src,
				"key %s in %s is outside any section%s", sec, src, bareKeyHint(sec)))
			continue
		case !isTable:
			report(sec, keyErr(ErrType, sec, src,
				"%s = %s in %s: want a table ([%s])", sec, formatValue(val), src, sec))
			continue
		}
		for _, name := range sortedKeys(body) {
			key := sec + "." + name
			src := where(key)
			f := schema.byKey[key]
			if f == nil {
				report(key, keyErr(ErrUnknownKey, key, src,
					"unknown key %s in %s%s", key, src, unknownKeyHint(key)))
				continue
			}
			if _, ok := checkValue(f, body[name]); !ok {
				report(key, keyErr(ErrType, key, src,
					"%s = %s in %s: want %s", key, formatValue(body[name]), src, f.kind.want()))
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	sort.SliceStable(errs, func(a, b int) bool { return errs[a].line < errs[b].line })
	all := make([]error, len(errs))
	for i, e := range errs {
		all[i] = e.err
	}
	return errors.Join(all...)
}

// keyLines maps each dotted key path of a TOML document ("training",
// "training.steps") to the line where it first appears. It is best effort:
// on a parse error it returns what it has (the document was already parsed
// successfully by the caller, so that does not happen in practice).
func keyLines(data []byte) map[string]int {
	lines := map[string]int{}
	var p unstable.Parser
	p.Reset(data)
	keyOf := func(n *unstable.Node) (string, int) {
		var parts []string
		line := 0
		it := n.Key()
		for it.Next() {
			k := it.Node()
			if line == 0 {
				line = p.Shape(k.Raw).Start.Line
			}
			parts = append(parts, string(k.Data))
		}
		return strings.Join(parts, "."), line
	}
	record := func(path string, line int) {
		// Record the path and its parents ("a.b.c" also marks "a", "a.b").
		for {
			if _, ok := lines[path]; !ok {
				lines[path] = line
			}
			i := strings.LastIndexByte(path, '.')
			if i < 0 {
				return
			}
			path = path[:i]
		}
	}
	var walkKV func(prefix string, n *unstable.Node)
	walkKV = func(prefix string, n *unstable.Node) {
		k, line := keyOf(n)
		full := k
		if prefix != "" {
			full = prefix + "." + k
		}
		record(full, line)
		if v := n.Value(); v.Kind == unstable.InlineTable {
			it := v.Children()
			for it.Next() {
				walkKV(full, it.Node())
			}
		}
	}
	prefix := ""
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			k, line := keyOf(e)
			prefix = k
			record(k, line)
		case unstable.KeyValue:
			walkKV(prefix, e)
		}
	}
	return lines
}

// formatValue renders a TOML-decoded value for an error message.
func formatValue(v any) string {
	switch x := v.(type) {
	case string:
		return strconv.Quote(x)
	case float64:
		s := strconv.FormatFloat(x, 'g', -1, 64)
		if !strings.ContainsAny(s, ".eEnN") {
			s += ".0" // 3.0 must not read as the integer 3
		}
		return s
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = formatValue(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case map[string]any:
		return "{...}"
	default:
		return fmt.Sprint(x)
	}
}
