package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoadRecipe feeds arbitrary bytes to Load as a recipe file: it may
// refuse them with an error but never panic or hang. The seeds (the
// repository's recipes and broken forms of one) run in the normal suite.
func FuzzLoadRecipe(f *testing.F) {
	recipes, _ := filepath.Glob("../../recipes/*.toml")
	for _, p := range recipes {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("[training]\nsteps = 10\nlocal_batch_size = \"two\"\n"))
	f.Add([]byte("[training\nsteps = 1e999\n"))
	f.Add([]byte("[checkpoint]\nexclude_from_loading = [1, [2], {a=3}]\nkeep_latest_k = -9223372036854775808\n"))
	f.Add([]byte("[[model]]\nname = 'x'\n[model]\n"))
	f.Add([]byte("a.b.c.d = 1\n\"\\u0000\" = 2\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "r.toml")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		_, _ = Load(p, nil, nil)
	})
}
