//go:build cgo

package aggify

import (
	"embed"
	"path"
	"sort"
	"strings"
)

//go:embed analyses/*.sql
var analysesFS embed.FS

// Builtin is one built-in analysis: a PL/pgSQL cursor loop over the run
// store's metrics table, with an optional outer query.
type Builtin struct {
	Name   string // file name without .sql
	Source string
}

// Builtins returns the built-in analyses (internal/aggify/analyses/*.sql),
// sorted by name.
func Builtins() []Builtin {
	ents, _ := analysesFS.ReadDir("analyses")
	var out []Builtin
	for _, e := range ents {
		b, _ := analysesFS.ReadFile(path.Join("analyses", e.Name()))
		out = append(out, Builtin{Name: strings.TrimSuffix(e.Name(), ".sql"), Source: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// LookupBuiltin returns the built-in analysis called name.
func LookupBuiltin(name string) (Builtin, bool) {
	for _, b := range Builtins() {
		if b.Name == name {
			return b, true
		}
	}
	return Builtin{}, false
}
