package llama

import (
	"testing"

	"github.com/titan-go/titan/internal/backend/cpu"
)

// TestInferenceMatchesForward checks the KV-cache path against the
// training forward: the logits at every position agree, whether the
// prompt is fed at once, token by token, or in uneven pieces.
func TestInferenceMatchesForward(t *testing.T) {
	ref := loadReference(t, "testdata/llama_tiny_reference.bin")
	cfg := ref.llamaConfig()
	be := cpu.New(2)
	defer be.Close()
	T := ref.Config.SeqLen
	m, err := New(be, cfg, 1, T, Plan{})
	if err != nil {
		t.Fatal(err)
	}
	be.Upload(m.Params, ref.flatParams(t, cfg, "params/"))
	tokens := ref.i32["tokens"][:T]
	if _, err := m.Forward(tokens, nil); err != nil {
		t.Fatal(err)
	}
	V := cfg.VocabSize
	want := make([]float32, T*V)
	if err := m.Logits(want); err != nil {
		t.Fatal(err)
	}
	for _, pieces := range [][]int{{T}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {5, 1, 7, 3}} {
		in, err := NewInference(m, T)
		if err != nil {
			t.Fatal(err)
		}
		pos := 0
		for _, n := range pieces {
			logits, err := in.Next(tokens[pos : pos+n])
			if err != nil {
				t.Fatal(err)
			}
			pos += n
			checkClose(t, "logits at position", logits, want[(pos-1)*V:pos*V], 1e-5)
		}
		if _, err := in.Next(tokens[:1]); err == nil {
			t.Error("a token beyond the generation length must be refused")
		}
	}
}
