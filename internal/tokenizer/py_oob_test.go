package tokenizer

import (
	"encoding/json"
	"os"
	"slices"
	"testing"
	"unicode"
)

func TestPythonOOB(t *testing.T) {
	data, err := os.ReadFile("/tmp/tok/cases.json")
	if err != nil {
		t.Skip()
	}
	var cases [][]json.RawMessage
	json.Unmarshal(data, &cases)
	bad, skipped := 0, 0
	for _, c := range cases {
		var s string
		json.Unmarshal(c[0], &s)
		skip := false
		for _, r := range s {
			if !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs) {
				skip = true
			}
		}
		if skip {
			skipped++
			continue
		}
		for k, sp := range []splitter{splitLlama3, splitQwen2, splitGPT2} {
			var want []string
			json.Unmarshal(c[k+1], &want)
			got := sp.appendPieces(nil, s)
			if len(want) == 0 && len(got) == 0 {
				continue
			}
			if !slices.Equal(got, want) {
				bad++
				if bad < 10 {
					t.Errorf("sp %d %q: got %q want %q", sp, s, got, want)
				}
			}
		}
	}
	t.Logf("%d cases, %d bad, %d skipped", len(cases), bad, skipped)
}
