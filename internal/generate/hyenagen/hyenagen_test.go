package hyenagen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/generate"
	"github.com/titan-go/titan/internal/longconv"
	"github.com/titan-go/titan/internal/model/hyena"
)

// testModel is a small random Hyena model of the given order whose
// filters are long enough for L = 130 positions (not a power of two, and
// past the 120 positions from which the training forward convolves by
// FFT), with l_max beyond it so generation stops short of l_max.
func testModel(t testing.TB, be backend.Backend, order int) (hyena.Config, backend.Tensor) {
	t.Helper()
	c, err := hyena.Flavor("tiny")
	if err != nil {
		t.Fatal(err)
	}
	c.DModel, c.DInner, c.VocabSize, c.Order, c.LMax = 8, 20, 29, order, 160
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	flat := be.Alloc(backend.Float32, int(c.NumParams()))
	be.Upload(flat, randomParams(c, 7+uint64(order)))
	return c, flat
}

// randomParams returns moderate random values for every parameter
// (weights scaled by fan-in, norms near 1, Sin frequencies near 1.5,
// skip terms of order 1), so that the long convolutions matter to the
// logits; the initialisation's 0.02 would leave the model near-linear.
func randomParams(c hyena.Config, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 5))
	flat := make([]float32, c.NumParams())
	for _, p := range c.Layout() {
		v := flat[p.Offset : p.Offset+p.Size]
		base, std := 0.0, 0.5
		switch {
		case strings.Contains(p.Name, "norm") || strings.HasPrefix(p.Name, "ln_f"):
			if strings.HasSuffix(p.Name, "weight") {
				base, std = 1, 0.2
			} else {
				std = 0.1
			}
		case strings.HasSuffix(p.Name, ".freq"):
			base, std = 1.5, 0.3
		case strings.HasSuffix(p.Name, ".weight") && len(p.Shape) == 2:
			std = 1 / math.Sqrt(float64(p.Shape[1]))
		case strings.HasSuffix(p.Name, "pos_emb.z"):
			std = 1
		}
		for i := range v {
			v[i] = float32(base + std*r.NormFloat64())
		}
	}
	return flat
}

func newBackend(t testing.TB) *cpu.Backend {
	t.Helper()
	be := cpu.New(2)
	t.Cleanup(be.Close)
	return be
}

func randomTokens(c hyena.Config, n int, seed uint64) []int32 {
	r := rand.New(rand.NewPCG(seed, 9))
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(r.IntN(c.VocabSize))
	}
	return out
}

// forwardLogits runs the parallel training forward over tokens [B × T]
// and returns its logits [B, T, V] (padding columns dropped).
func forwardLogits(t testing.TB, be backend.Backend, c hyena.Config, params backend.Tensor, tokens []int32, B, T int) []float32 {
	t.Helper()
	m, err := hyena.New(be, c, B, T, hyena.Options{External: true, LogitChunk: c.PaddedVocab()})
	if err != nil {
		t.Fatal(err)
	}
	m.Bind(params, backend.Tensor{})
	if _, err := m.Forward(tokens, nil); err != nil {
		t.Fatal(err)
	}
	Vp, V := c.PaddedVocab(), c.VocabSize
	padded := make([]float32, B*T*Vp)
	if err := m.Logits(padded); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, B*T*V)
	for i := range B * T {
		copy(out[i*V:(i+1)*V], padded[i*Vp:])
	}
	return out
}

// column returns position t of every row of tokens [B × T].
func column(tokens []int32, B, T, t int) []int32 {
	out := make([]int32, B)
	for b := range out {
		out[b] = tokens[b*T+t]
	}
	return out
}

// prompt returns the first P positions of every row of tokens [B × T].
func prompt(tokens []int32, B, T, P int) []int32 {
	out := make([]int32, 0, B*P)
	for b := range B {
		out = append(out, tokens[b*T:b*T+P]...)
	}
	return out
}

// teacherForced runs a Generator over tokens [B × T]: the first P
// positions prefilled, the rest stepped. It returns the logits [B, T, V]
// of every position from P-1 on (the earlier ones are left NaN).
func teacherForced(t testing.TB, g *Generator, tokens []int32, B, T, P int) []float32 {
	t.Helper()
	V := g.V()
	out := make([]float32, B*T*V)
	for i := range out {
		out[i] = float32(math.NaN())
	}
	put := func(pos int, logits []float32) {
		for b := range B {
			copy(out[(b*T+pos)*V:(b*T+pos+1)*V], logits[b*V:(b+1)*V])
		}
	}
	logits, err := g.Prefill(prompt(tokens, B, T, P))
	if err != nil {
		t.Fatal(err)
	}
	if P > 0 {
		put(P-1, logits)
	}
	for pos := P; pos < T; pos++ {
		logits, err := g.Step(column(tokens, B, T, pos))
		if err != nil {
			t.Fatal(err)
		}
		put(pos, logits)
	}
	return out
}

// rowErr is the largest difference of got from want over one position's
// logits, relative to the largest |want| there.
func rowErr(got, want []float32) float64 {
	var d, scale float64
	for i := range want {
		d = max(d, math.Abs(float64(got[i])-float64(want[i])))
		scale = max(scale, math.Abs(float64(want[i])))
	}
	return d / max(scale, 1e-30)
}

type modeCase struct {
	name string
	opt  Options
}

func modeCases(B, L int) []modeCase {
	return []modeCase{
		{"lazy", Options{Mode: longconv.Lazy, B: B, L: L}},
		{"eager", Options{Mode: longconv.Eager, B: B, L: L}},
		{"flash", Options{Mode: longconv.Flash, B: B, L: L}},
		// Every tile of side ≥ 8 by FFT, and two goroutines.
		{"flash fft8", Options{Mode: longconv.Flash, B: B, L: L, FFTTile: 8, Threads: 2}},
	}
}

// TestTeacherForcedMatchesForward is the first must-show: with
// the prompt prefilled in one parallel pass and the rest stepped, lazy,
// eager and flash give the parallel training forward's logits at every
// position, for prompts of 0, 1, 7, 8 and 100 tokens, three sequences,
// orders 2 and 3, 130 positions (not a power of two, short of l_max).
func TestTeacherForcedMatchesForward(t *testing.T) {
	be := newBackend(t)
	const B, T = 3, 130
	for _, order := range []int{2, 3} {
		c, params := testModel(t, be, order)
		tokens := randomTokens(c, B*T, uint64(order))
		want := forwardLogits(t, be, c, params, tokens, B, T)
		V := c.VocabSize
		for _, mc := range modeCases(B, T) {
			for _, P := range []int{0, 1, 7, 8, 100} {
				t.Run(fmt.Sprintf("order %d/%s/P=%d", order, mc.name, P), func(t *testing.T) {
					g, err := New(be, c, params, mc.opt)
					if err != nil {
						t.Fatal(err)
					}
					got := teacherForced(t, g, tokens, B, T, P)
					var worst float64
					for b := range B {
						for pos := max(P-1, 0); pos < T; pos++ {
							k := (b*T + pos) * V
							e := rowErr(got[k:k+V], want[k:k+V])
							worst = max(worst, e)
							if !(e <= 2e-5) { // also catches NaN
								t.Fatalf("row %d, position %d: logits differ from the forward's by %.3g (relative)", b, pos, e)
							}
						}
					}
					if s := g.Stats(); s.Positions != T || s.Steps != T-P {
						t.Errorf("stats: %d positions, %d steps; want %d, %d", s.Positions, s.Steps, T, T-P)
					}
					t.Logf("worst relative error %.2g", worst)
				})
			}
		}
	}
}

// top2 returns the index of the largest value and its margin over the
// second largest.
func top2(v []float32) (best int, margin float64) {
	second := math.Inf(-1)
	for i, x := range v {
		switch {
		case x > v[best]:
			second = float64(v[best])
			best = i
		case i != best && float64(x) > second:
			second = float64(x)
		}
	}
	return best, float64(v[best]) - second
}

// greedy generates n tokens per row greedily after a prompt of P tokens
// (P = 0: the first token is first), returning the whole sequences
// [B × (P+n)] and the margin of the top logit over the runner-up at
// every generated position.
func greedy(t testing.TB, g *Generator, promptToks []int32, first []int32, P, n int) (seq []int32, margins []float64) {
	t.Helper()
	B, V := g.B(), g.V()
	rows := make([][]int32, B)
	var logits []float32
	var err error
	if P > 0 {
		for b := range B {
			rows[b] = slices.Clone(promptToks[b*P : (b+1)*P])
		}
		logits, err = g.Prefill(promptToks)
	} else {
		for b := range B {
			rows[b] = []int32{first[b]}
		}
		logits, err = g.Step(first)
	}
	if err != nil {
		t.Fatal(err)
	}
	next := make([]int32, B)
	for len(rows[0]) < max(P, 1)+n {
		for b := range B {
			tok, m := top2(logits[b*V : (b+1)*V])
			next[b] = int32(tok)
			rows[b] = append(rows[b], int32(tok))
			margins = append(margins, m)
		}
		if len(rows[0]) == max(P, 1)+n {
			break
		}
		if logits, err = g.Step(next); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range rows {
		seq = append(seq, r...)
	}
	return seq, margins
}

// TestGreedyTokensAgree: greedy generation gives the same tokens in
// every mode, and they are the argmax of the training forward's logits
// over the generated sequence. A disagreement is accepted only at a
// near-tie (top-2 margin below 1e-4 of the logit scale), where float32
// rounding may rightly flip the choice; none occurs with these seeds.
func TestGreedyTokensAgree(t *testing.T) {
	be := newBackend(t)
	const B, L = 2, 130
	for _, order := range []int{2, 3} {
		c, params := testModel(t, be, order)
		V := c.VocabSize
		for _, P := range []int{0, 7} {
			t.Run(fmt.Sprintf("order %d/P=%d", order, P), func(t *testing.T) {
				promptToks := randomTokens(c, B*P, 11)
				first := randomTokens(c, B, 12)
				n := L - max(P, 1)
				var ref []int32
				var refMargins []float64
				for _, mc := range modeCases(B, L) {
					g, err := New(be, c, params, mc.opt)
					if err != nil {
						t.Fatal(err)
					}
					seq, margins := greedy(t, g, promptToks, first, P, n)
					if ref == nil {
						ref, refMargins = seq, margins
						continue
					}
					for i := range seq {
						if seq[i] != ref[i] {
							row, pos := i/L, i%L
							m := refMargins[(pos-max(P, 1))*B+row]
							if m > 1e-4 {
								t.Fatalf("%s: row %d, position %d: token %d, lazy chose %d with a margin of %.3g", mc.name, row, pos, seq[i], ref[i], m)
							}
							t.Logf("%s: near-tie at row %d, position %d (margin %.2g)", mc.name, row, pos, m)
							break
						}
					}
				}
				// The generated tokens are the forward's argmax.
				want := forwardLogits(t, be, c, params, ref, B, L)
				for b := range B {
					for pos := max(P, 1) - 1; pos < L-1; pos++ {
						k := (b*L + pos) * V
						best, m := top2(want[k : k+V])
						if got := ref[b*L+pos+1]; int(got) != best && m > 1e-4 {
							t.Fatalf("row %d, position %d: generated %d, the forward's argmax is %d (margin %.3g)", b, pos+1, got, best, m)
						}
					}
				}
			})
		}
	}
}

// TestCausality: changing the token at position j (fed by Step) of one
// row changes no logit before j, of any row, and no logit of the other
// rows: they are bitwise equal. It changes that row's logits from j on.
func TestCausality(t *testing.T) {
	be := newBackend(t)
	const B, T, P = 2, 130, 8
	for _, order := range []int{2, 3} {
		c, params := testModel(t, be, order)
		V := c.VocabSize
		tokens := randomTokens(c, B*T, 21)
		for _, mc := range modeCases(B, T) {
			run := func(tok []int32, P int) []float32 {
				g, err := New(be, c, params, mc.opt)
				if err != nil {
					t.Fatal(err)
				}
				return teacherForced(t, g, tok, B, T, P)
			}
			for _, P := range []int{0, P} {
				base := run(tokens, P)
				for _, j := range []int{P, P + 37, T - 1} {
					t.Run(fmt.Sprintf("order %d/%s/P=%d/j=%d", order, mc.name, P, j), func(t *testing.T) {
						changed := slices.Clone(tokens)
						changed[T+j] = (changed[T+j] + 1) % int32(c.VocabSize) // row 1
						got := run(changed, P)
						moved := false
						for b := range B {
							for pos := max(P-1, 0); pos < T; pos++ {
								k := (b*T + pos) * V
								same := slices.Equal(got[k:k+V], base[k:k+V])
								if (b != 1 || pos < j) && !same {
									t.Fatalf("row %d, position %d: logits moved", b, pos)
								}
								if b == 1 && pos == j && !same {
									moved = true
								}
							}
						}
						if !moved {
							t.Errorf("the logits at the changed position %d did not move", j)
						}
					})
				}
			}
		}
	}
}

// TestSample: Sample generates the same text as greedy stepping, stops a
// row at EOS, and each row's sampler is its own.
func TestSample(t *testing.T) {
	be := newBackend(t)
	c, params := testModel(t, be, 2)
	const B, L = 3, 40
	g, err := New(be, c, params, Options{Mode: longconv.Flash, B: B, L: L})
	if err != nil {
		t.Fatal(err)
	}
	promptToks := []int32{3, 1, 4, 1, 5}
	var samplers []*generate.Sampler
	for b := range B {
		s, err := generate.NewSampler(0, 0, 1, uint64(b))
		if err != nil {
			t.Fatal(err)
		}
		samplers = append(samplers, s)
	}
	got, err := g.Sample(promptToks, 100, samplers, -1, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Greedy: every row is the same, and capacity L-5 steps give L-5+1 tokens.
	for b := range B {
		if len(got[b]) != L-len(promptToks)+1 || !slices.Equal(got[b], got[0]) {
			t.Fatalf("row %d: %v, row 0: %v", b, got[b], got[0])
		}
	}
	g.Reset()
	eos := got[0][3]
	short, err := g.Sample(promptToks, 100, samplers, eos, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := slices.Index(got[0], eos); len(short[0]) != want {
		t.Errorf("with EOS %d the row has %d tokens, want %d", eos, len(short[0]), want)
	}
}

// TestErrors: capacities, prompts, positions and tokens out of range are
// refused with errors naming them.
func TestErrors(t *testing.T) {
	be := newBackend(t)
	c, params := testModel(t, be, 2)
	for _, tc := range []struct {
		name string
		run  func() error
		want string
	}{
		{"capacity beyond l_max", func() error {
			_, err := New(be, c, params, Options{B: 1, L: c.LMax + 1})
			return err
		}, "l_max"},
		{"no rows", func() error {
			_, err := New(be, c, params, Options{B: 0, L: 8})
			return err
		}, "batch"},
		{"ragged prompt", func() error {
			g, _ := New(be, c, params, Options{B: 2, L: 8})
			_, err := g.Prefill([]int32{1, 2, 3})
			return err
		}, "rows"},
		{"prompt beyond capacity", func() error {
			g, _ := New(be, c, params, Options{B: 1, L: 8})
			_, err := g.Prefill(make([]int32, 9))
			return err
		}, "capacity"},
		{"prefill after a step", func() error {
			g, _ := New(be, c, params, Options{B: 1, L: 8})
			g.Step([]int32{1})
			_, err := g.Prefill([]int32{1})
			return err
		}, "position 1"},
		{"step beyond capacity", func() error {
			g, _ := New(be, c, params, Options{B: 1, L: 1})
			g.Step([]int32{1})
			_, err := g.Step([]int32{1})
			return err
		}, "capacity"},
		{"token outside the vocabulary", func() error {
			g, _ := New(be, c, params, Options{B: 1, L: 4})
			_, err := g.Step([]int32{int32(c.VocabSize)})
			return err
		}, "vocabulary"},
		{"unknown mode", func() error {
			_, err := ParseMode("fast")
			return err
		}, "fast"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.run(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
