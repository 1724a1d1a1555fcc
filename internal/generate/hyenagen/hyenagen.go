// Package hyenagen generates text with a Hyena language model, exactly:
// the model runs one position at a time (hyena.Stepper) around its long
// convolutions, which a longconv.Online computes lazily, eagerly or with
// Flash Inference's relaxed tiling (Oncescu et al., ICLR 2025). The three
// modes give the same logits up to float32 rounding; only their cost
// differs (O(L²) against O(L log² L) per channel for L positions).
//
// # Prompts
//
// A Generator holds B sequences of at most L positions (L ≤ l_max).
// Prefill takes a prompt of the same length P ≥ 1 for every row and
// computes it in one parallel pass: the training forward pass over the
// prompt gives every layer's long-convolution inputs and short-convolution
// states, and Online.Prefill then convolves each (layer, convolution)
// with its whole filter by FFT, leaving the prompt's contribution to
// every later position in the accumulators. It returns the logits of the
// position after the prompt.
//
// An empty prompt (P = 0) is a no-op: generation then starts with Step on
// a first token per row that the caller picks. titan generate always
// has one, because it starts every prompt with the tokenizer's BOS (as
// for llama) and refuses an empty prompt when there is none; the
// benchmark starts from token 0.
//
// # Cost accounting
//
// Stats separates the time of the position mixing (everything in the
// Online: red cells, lazy dot products, eager pushes, flash tiles and
// the prefill's FFT convolutions) from the rest of the model (embedding,
// norms, projections, short convolutions, MLPs, the head, and in Prefill
// the training forward over the prompt, whose own convolutions count
// there). Filter materialisation and the Online's setup are reported
// apart (Setup), not in Total.
package hyenagen

import (
	"fmt"
	"strings"
	"time"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/longconv"
	"github.com/titan-go/titan/internal/model/hyena"
)

// Modes lists the mode names ParseMode accepts, in their usual order.
var Modes = []string{"lazy", "eager", "flash"}

// ParseMode returns the longconv mode named s: "lazy", "eager" or
// "flash".
func ParseMode(s string) (longconv.Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "lazy":
		return longconv.Lazy, nil
	case "eager":
		return longconv.Eager, nil
	case "flash":
		return longconv.Flash, nil
	}
	return 0, fmt.Errorf("unknown mode %q (want lazy, eager or flash)", s)
}

// Options describe a Generator.
type Options struct {
	// Mode is how the long convolutions are computed online.
	Mode longconv.Mode
	// B is the number of sequences generated together (≥ 1).
	B int
	// L is the capacity: positions 0..L-1 (prompt included) can be
	// generated; 1 ≤ L ≤ l_max.
	L int
	// Threads is the number of goroutines of the online convolution
	// (below 1: GOMAXPROCS); results do not depend on it.
	Threads int
	// FFTTile and SpectrumBytes are passed to longconv.OnlineConfig
	// (Flash only; 0: the defaults).
	FFTTile       int
	SpectrumBytes int64
}

// Stats reports where a Generator spent its time since it was built or
// since the last ResetStats.
type Stats struct {
	// Total is the time spent in Prefill and Step.
	Total time.Duration
	// Mixer is the part of Total spent in the online long convolutions
	// (longconv.Stats.Mixer).
	Mixer time.Duration
	// Tiles is the part of Mixer spent computing flash tiles.
	Tiles time.Duration
	// Prefill is the part of Total spent in Prefill, and PrefillMixer
	// the part of it in Online.Prefill.
	Prefill, PrefillMixer time.Duration
	// Setup is the time New spent materialising the filters and setting
	// up the online convolution (cached spectra); not part of Total.
	Setup time.Duration
	// Steps is the number of Step calls; Positions the positions
	// computed per row (prompt included).
	Steps, Positions int
	// DirectTiles and FFTTiles count the (row, tile) pairs of Flash.
	DirectTiles, FFTTiles int64
}

// Other is the time outside the position mixing: Total - Mixer.
func (s Stats) Other() time.Duration { return s.Total - s.Mixer }

// Generator runs a Hyena model for B sequences position by position. It
// is not safe for concurrent use.
type Generator struct {
	// Cfg is the model's shape.
	Cfg hyena.Config

	opt     Options
	be      backend.Backend
	params  backend.Tensor
	st      *hyena.Stepper
	state   []hyena.LayerState
	on      *longconv.Online
	a, u, y backend.Tensor // [B, D]
	logits  backend.Tensor // [B, PaddedVocab]
	xh, yh  []float32      // host staging of u and y (device backends)
	lh      []float32      // host logits [B, PaddedVocab]
	out     []float32      // [B, VocabSize]
	pos     int
	total   time.Duration
	prefill time.Duration
	prefMix time.Duration
	steps   int
	setup   time.Duration
}

// New builds a Generator for the whole model whose flat parameter buffer
// (hyena.Config.Layout order) is params on be. It materialises every
// layer's filters for L positions and sets up the online convolution of
// all NLayer·(Order-1) long convolutions.
func New(be backend.Backend, cfg hyena.Config, params backend.Tensor, opt Options) (*Generator, error) {
	start := time.Now()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case opt.B < 1:
		return nil, fmt.Errorf("hyenagen: batch size %d < 1", opt.B)
	case opt.L < 1 || opt.L > cfg.LMax:
		return nil, fmt.Errorf("hyenagen: capacity %d outside [1, l_max %d]", opt.L, cfg.LMax)
	case int64(params.Len) != cfg.NumParams():
		return nil, fmt.Errorf("hyenagen: parameter buffer has %d elements, the model %d", params.Len, cfg.NumParams())
	}
	st, err := hyena.NewStepper(be, cfg, hyena.View(cfg, params), opt.B)
	if err != nil {
		return nil, err
	}
	B, D, L, O := opt.B, cfg.DModel, opt.L, cfg.Order-1
	g := &Generator{Cfg: cfg, opt: opt, be: be, params: params, st: st, state: st.NewState()}
	alloc := func(n int) backend.Tensor { return be.Alloc(backend.Float32, n) }
	g.a, g.u, g.y = alloc(B*D), alloc(B*D), alloc(B*D)
	g.logits = alloc(B * cfg.PaddedVocab())
	g.lh = make([]float32, B*cfg.PaddedVocab())
	g.out = make([]float32, B*cfg.VocabSize)
	if _, ok := g.u.HostFloat32(); !ok {
		g.xh, g.yh = make([]float32, B*D), make([]float32, B*D)
	}

	// One online "layer" per long convolution, in the order the model
	// applies them: layer l's o-th convolution is number l·O+o.
	filters := make([][]float32, 0, cfg.NLayer*O)
	channels := make([]int, 0, cfg.NLayer*O)
	h := alloc(O * D * L)
	for l := 0; l < cfg.NLayer; l++ {
		if err := st.Filters(l, L, h, backend.Tensor{}); err != nil {
			return nil, err
		}
		host := make([]float32, O*D*L)
		be.Download(host, h)
		for o := 0; o < O; o++ {
			filters = append(filters, host[o*D*L:(o+1)*D*L])
			channels = append(channels, D)
		}
	}
	g.on, err = longconv.NewOnline(longconv.OnlineConfig{
		Mode: opt.Mode, B: B, LMax: L, Channels: channels, Filters: filters, FilterLen: L,
		Threads: opt.Threads, FFTTile: opt.FFTTile, SpectrumBytes: opt.SpectrumBytes,
	})
	if err != nil {
		return nil, err
	}
	g.setup = time.Since(start)
	return g, nil
}

// Mode is the online convolution's mode.
func (g *Generator) Mode() longconv.Mode { return g.opt.Mode }

// B is the number of sequences.
func (g *Generator) B() int { return g.opt.B }

// Capacity is L, the most positions a sequence can have.
func (g *Generator) Capacity() int { return g.opt.L }

// Pos is the number of positions computed so far (the position the next
// Step feeds).
func (g *Generator) Pos() int { return g.pos }

// V is the number of logits per sequence: the tokenizer's vocabulary
// (the padding columns of the tied head are dropped).
func (g *Generator) V() int { return g.Cfg.VocabSize }

// FFTTile is the smallest tile side Flash computes by FFT (0 when none
// is, or for the other modes).
func (g *Generator) FFTTile() int {
	if g.opt.Mode != longconv.Flash {
		return 0
	}
	if g.opt.FFTTile == 0 {
		return longconv.DefaultFFTTile
	}
	return max(g.opt.FFTTile, 0)
}

// Reset returns to position 0 with empty sequences, keeping the filters
// and the statistics.
func (g *Generator) Reset() {
	g.on.Reset()
	for _, s := range g.state {
		g.be.Zero(s.Conv)
	}
	g.pos = 0
}

// Stats returns the time accounting since New or the last ResetStats.
func (g *Generator) Stats() Stats {
	ls := g.on.Stats()
	return Stats{
		Total: g.total, Mixer: ls.Mixer, Tiles: ls.Tiles,
		Prefill: g.prefill, PrefillMixer: g.prefMix, Setup: g.setup,
		Steps: g.steps, Positions: g.pos,
		DirectTiles: ls.DirectTiles, FFTTiles: ls.FFTTiles,
	}
}

// ResetStats zeroes the statistics except Setup.
func (g *Generator) ResetStats() {
	g.on.ResetStats()
	g.total, g.prefill, g.prefMix, g.steps = 0, 0, 0, 0
}

// Prefill runs the prompt tokens [B × P] (row b's P tokens contiguous,
// every row the same length) through the model in one parallel pass and
// returns the logits [B, V] of the position after the prompt. It must
// start the sequences (position 0; Reset first to reuse a Generator) and
// leave room: P ≤ L. P = 0 does nothing and returns nil logits (see the
// package documentation). The logits are overwritten by the next call.
// The call allocates the training forward's activations for B×P tokens
// (a hyena.Model of that shape), released when it returns.
func (g *Generator) Prefill(tokens []int32) ([]float32, error) {
	B, c := g.opt.B, g.Cfg
	if len(tokens)%B != 0 {
		return nil, fmt.Errorf("hyenagen: prompt of %d tokens is not %d rows of the same length", len(tokens), B)
	}
	P := len(tokens) / B
	if P == 0 {
		return nil, nil
	}
	if g.pos != 0 {
		return nil, fmt.Errorf("hyenagen: Prefill at position %d: a prompt starts the sequences (Reset first)", g.pos)
	}
	if P > g.opt.L {
		return nil, fmt.Errorf("hyenagen: prompt of %d tokens exceeds the capacity %d", P, g.opt.L)
	}
	start := time.Now()
	m, err := hyena.New(g.be, c, B, P, hyena.Options{External: true, LogitChunk: 1})
	if err != nil {
		return nil, err
	}
	m.Bind(g.params, backend.Tensor{})
	if _, err := m.Forward(tokens, nil); err != nil {
		return nil, err
	}
	mix0 := g.on.Stats().Prefill
	O := c.Order - 1
	var stage []float32
	for l := 0; l < c.NLayer; l++ {
		for o := 0; o < O; o++ {
			x := m.ConvInput(l, o) // [B, D, P]: the layout Online.Prefill wants
			xs, ok := x.HostFloat32()
			if !ok {
				if stage == nil {
					stage = make([]float32, x.Len)
				}
				xs = stage
				g.be.Download(xs, x)
			}
			// The outputs (the prompt's, already in the forward pass)
			// overwrite the inputs, which nothing reads any more.
			if err := g.on.Prefill(l*O+o, xs, xs); err != nil {
				return nil, err
			}
		}
		if err := m.StepState(l, &g.state[l]); err != nil {
			return nil, err
		}
	}
	if err := m.LastHidden(g.a); err != nil {
		return nil, err
	}
	out := g.logitsOut()
	g.pos = P
	d := time.Since(start)
	g.total += d
	g.prefill += d
	g.prefMix += g.on.Stats().Prefill - mix0
	return out, nil
}

// Step feeds one token per sequence at position Pos() and returns the
// logits [B, V] of the next position, overwritten by the next call.
func (g *Generator) Step(tokens []int32) ([]float32, error) {
	if g.pos >= g.opt.L {
		return nil, fmt.Errorf("hyenagen: step at position %d: the capacity is %d", g.pos, g.opt.L)
	}
	start := time.Now()
	s, c := g.st, g.Cfg
	if err := s.Embed(tokens, g.a); err != nil {
		return nil, err
	}
	O := c.Order - 1
	for l := 0; l < c.NLayer; l++ {
		s.Pre(l, &g.state[l], g.a, g.u)
		for o := 0; o < O; o++ {
			if err := g.conv(l*O + o); err != nil {
				return nil, err
			}
			if o < O-1 {
				s.Mid(l, o, g.y, g.u)
			} else {
				s.Post(l, g.y, g.u, g.a)
			}
		}
	}
	out := g.logitsOut()
	g.pos++
	g.steps++
	g.total += time.Since(start)
	return out, nil
}

// conv runs online convolution k for the current position: y from u.
func (g *Generator) conv(k int) error {
	x, okx := g.u.HostFloat32()
	y, oky := g.y.HostFloat32()
	if okx && oky {
		return g.on.Step(k, y, x)
	}
	g.be.Download(g.xh, g.u)
	if err := g.on.Step(k, g.yh, g.xh); err != nil {
		return err
	}
	g.be.Upload(g.y, g.yh)
	return nil
}

// logitsOut computes the logits of the hidden states in a and returns
// them without the padding columns.
func (g *Generator) logitsOut() []float32 {
	g.st.Logits(g.a, g.logits)
	Vp, V := g.Cfg.PaddedVocab(), g.Cfg.VocabSize
	lh, ok := g.logits.HostFloat32()
	if !ok {
		g.be.Download(g.lh, g.logits)
		lh = g.lh
	}
	if V == Vp {
		copy(g.out, lh)
		return g.out
	}
	for b := 0; b < g.opt.B; b++ {
		copy(g.out[b*V:(b+1)*V], lh[b*Vp:b*Vp+V])
	}
	return g.out
}
