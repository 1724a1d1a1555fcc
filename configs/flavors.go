package configs

import (
	"bytes"
	"fmt"
	"sort"

	"github.com/pelletier/go-toml/v2"
)

// Flavors decodes every table of the embedded flavor file (one flavor
// each) into a T that starts from defaults(), refusing unknown keys, and
// checks it with validate.
func Flavors[T any](file string, defaults func() T, validate func(T) error) (map[string]T, error) {
	raw, err := FS.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("flavors: %w", err)
	}
	var tables map[string]map[string]any
	if err := toml.Unmarshal(raw, &tables); err != nil {
		return nil, fmt.Errorf("flavors: configs/%s: %w", file, err)
	}
	out := make(map[string]T, len(tables))
	for name, t := range tables {
		c := defaults()
		b, err := toml.Marshal(t)
		if err != nil {
			return nil, err
		}
		dec := toml.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return nil, fmt.Errorf("flavor %q in configs/%s: %w", name, file, err)
		}
		if err := validate(c); err != nil {
			return nil, fmt.Errorf("flavor %q in configs/%s: %w", name, file, err)
		}
		out[name] = c
	}
	return out, nil
}

// Names lists the flavors of a Flavors map, sorted.
func Names[T any](all map[string]T) []string {
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Flavor returns the named flavor of file, or an error naming the family
// and listing the flavors there are.
func Flavor[T any](family, file, name string, defaults func() T, validate func(T) error) (T, error) {
	all, err := Flavors(file, defaults, validate)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%s %w", family, err)
	}
	c, ok := all[name]
	if !ok {
		var zero T
		return zero, fmt.Errorf("%s: unknown flavor %q (have %v)", family, name, Names(all))
	}
	return c, nil
}
