package evaluate

import (
	"math"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/model/llama"
)

// TestWindowsAndPaddingMatchOneForward checks that scoring a sequence
// through padded windows gives the same mean loss as one exact forward.
func TestWindowsAndPaddingMatchOneForward(t *testing.T) {
	cfg, _ := llama.Flavor("tiny")
	be := cpu.New(1)
	defer be.Close()
	params := make([]float32, cfg.NumParams())
	llama.InitParams(cfg, 5, params, 0)
	seq := make([]int32, 13)
	for i := range seq {
		seq[i] = int32((i * 7) % cfg.VocabSize)
	}
	// Reference: one forward over exactly 12 predictions.
	m, _ := llama.New(be, cfg, 1, 12, llama.Plan{})
	be.Upload(m.Params, params)
	want, err := m.Forward(seq[:12], seq[1:])
	if err != nil {
		t.Fatal(err)
	}
	// Padded window of 16 positions.
	e, err := New(be, cfg, params, 16)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Add(seq); err != nil {
		t.Fatal(err)
	}
	got, err := e.Result()
	if err != nil {
		t.Fatal(err)
	}
	if got.Tokens != 12 || math.Abs(got.Loss-float64(want)) > 1e-6*math.Abs(float64(want)) {
		t.Fatalf("padded window: %+v, want loss %v over 12 tokens", got, want)
	}
	if math.Abs(got.Perplexity-math.Exp(got.Loss)) > 1e-9 {
		t.Fatal("perplexity is not exp(loss)")
	}
	// Windows of 5: predictions split 5+5+2, the loss is still the mean of all 12.
	e5, _ := New(be, cfg, params, 5)
	e5.Add(seq)
	r5, _ := e5.Result()
	if r5.Tokens != 12 {
		t.Fatalf("windows of 5 predicted %d tokens, want 12", r5.Tokens)
	}
}

func TestReadTokenLines(t *testing.T) {
	seqs, err := ReadTokenLines(strings.NewReader("1 2 3\n\n 4\t5 \n"), 10)
	if err != nil || len(seqs) != 2 || len(seqs[0]) != 3 || seqs[1][1] != 5 {
		t.Fatalf("got %v, %v", seqs, err)
	}
	for _, bad := range []string{"1 x 3", "1 10", "-1"} {
		if _, err := ReadTokenLines(strings.NewReader(bad), 10); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%q: error %v should name line 1", bad, err)
		}
	}
}
