package llama

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
)

// acModes are the checkpointing policies the tests compare against "none".
var acModes = []ActivationCheckpoint{
	{Mode: "none"},
	{Mode: "full"},
	{Mode: "selective", SelectiveOption: "1"},
	{Mode: "selective", SelectiveOption: "2"},
	{Mode: "selective", SelectiveOption: "3"},
	{Mode: "selective", SelectiveOption: "op"},
}

// acRun is the outcome of two microbatches of forward and backward.
type acRun struct {
	losses     []float32
	grads      []float32
	recomputed int
}

// acBatch returns a deterministic microbatch.
func acBatch(cfg Config, n int, seed uint64) (tokens, targets []int32) {
	r := rand.New(rand.NewPCG(seed, 9))
	tokens, targets = make([]int32, n), make([]int32, n)
	for i := range tokens {
		tokens[i], targets[i] = int32(r.IntN(cfg.VocabSize)), int32(r.IntN(cfg.VocabSize))
	}
	targets[1] = -1
	return tokens, targets
}

// runAC accumulates the gradients of two microbatches under ac. With
// hooked set the model is External and a poisoningHooks binds its
// parameters, as sharded data parallelism with reshard-after-forward does.
func runAC(t *testing.T, cfg Config, B, T, chunk int, ac ActivationCheckpoint, hooked bool) acRun {
	t.Helper()
	be := cpu.New(2)
	defer be.Close()
	m, err := New(be, cfg, B, T, Plan{LogitChunk: chunk, Checkpoint: ac, External: hooked})
	if err != nil {
		t.Fatal(err)
	}
	master := make([]float32, cfg.NumParams())
	InitParams(cfg, 5, master, 0)
	var h *poisoningHooks
	if hooked {
		h = newPoisoningHooks(t, be, m, master)
		m.Hooks = h
	} else {
		be.Upload(m.Params, master)
		m.ZeroGrad()
	}
	var run acRun
	for mb := range 2 {
		tokens, targets := acBatch(cfg, B*T, uint64(mb))
		loss, err := m.Forward(tokens, targets)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Backward(1 / float32(2*m.NumTargets())); err != nil {
			t.Fatal(err)
		}
		run.losses = append(run.losses, loss)
	}
	if hooked {
		run.grads = h.grads
		if err := h.done(); err != nil {
			t.Fatal(err)
		}
	} else {
		run.grads = make([]float32, m.Grads.Len)
		be.Download(run.grads, m.Grads)
	}
	run.recomputed = m.recomputed
	return run
}

// TestCheckpointingIsBitwise: every checkpointing policy gives bitwise the
// losses and gradients of keeping every activation, on one model and
// under unit hooks that re-bind the parameters and poison them between
// uses (as FSDP with reshard-after-forward does), with the whole
// vocabulary in one logit chunk and in several; and the number of layer
// recomputations is the expected one (the last checkpointed layer of the
// forward pass is never recomputed).
func TestCheckpointingIsBitwise(t *testing.T) {
	tiny, _ := Flavor("tiny")
	deep := tiny
	deep.NLayers = 5
	for _, c := range []struct {
		name  string
		cfg   Config
		chunk int
	}{{"tiny", tiny, 0}, {"5layers", deep, 0}, {"5layers_chunked", deep, 7}} {
		for _, hooked := range []bool{false, true} {
			name := fmt.Sprintf("%s/hooked=%v", c.name, hooked)
			t.Run(name, func(t *testing.T) {
				const B, T = 2, 8
				ref := runAC(t, c.cfg, B, T, c.chunk, ActivationCheckpoint{}, hooked)
				for _, ac := range acModes {
					got := runAC(t, c.cfg, B, T, c.chunk, ac, hooked)
					for i := range ref.losses {
						if math.Float32bits(got.losses[i]) != math.Float32bits(ref.losses[i]) {
							t.Errorf("%v: microbatch %d loss %v, none %v", ac, i, got.losses[i], ref.losses[i])
						}
					}
					for i := range ref.grads {
						if math.Float32bits(got.grads[i]) != math.Float32bits(ref.grads[i]) {
							t.Errorf("%v: gradient element %d is %v, none %v", ac, i, got.grads[i], ref.grads[i])
							break
						}
					}
					ps, _ := ac.policies(c.cfg.NLayers)
					want := 0
					for _, p := range ps {
						if p != keepAll {
							want++
						}
					}
					want = 2 * max(0, want-1) // two backward passes
					if got.recomputed != want {
						t.Errorf("%v: %d layer recomputations, want %d", ac, got.recomputed, want)
					}
				}
			})
		}
	}
}

// poisoningHooks keep the parameters in a master copy and bind a unit's
// parameters only between its Before and After hooks, filling them with
// NaN outside (a computation that uses unbound parameters poisons the
// result); each unit's gradients go to a zeroed buffer bound in
// BeforeBackward and are added to grads in AfterBackward. They check
// that forward visits units in increasing order and backward in
// decreasing order, each Before matched by its After.
type poisoningHooks struct {
	t      *testing.T
	be     backend.Backend
	m      *Model
	units  []Unit
	master []float32
	grads  []float32
	pbuf   []backend.Tensor
	gbuf   []backend.Tensor
	open   int // unit between Before and After; -1: none
	next   int // unit expected next
	err    error
}

func newPoisoningHooks(t *testing.T, be backend.Backend, m *Model, master []float32) *poisoningHooks {
	h := &poisoningHooks{t: t, be: be, m: m, units: m.Cfg.Units(), master: master,
		grads: make([]float32, len(master)), open: -1}
	for _, u := range h.units {
		p, g := be.Alloc(backend.Float32, u.Hi-u.Lo), be.Alloc(backend.Float32, u.Hi-u.Lo)
		h.pbuf, h.gbuf = append(h.pbuf, p), append(h.gbuf, g)
		h.poison(p)
		m.BindUnit(len(h.pbuf)-1, p, g)
	}
	return h
}

func (h *poisoningHooks) poison(t backend.Tensor) {
	nan := make([]float32, t.Len)
	for i := range nan {
		nan[i] = float32(math.NaN())
	}
	h.be.Upload(t, nan)
}

func (h *poisoningHooks) fail(format string, args ...any) error {
	if h.err == nil {
		h.err = fmt.Errorf(format, args...)
	}
	return h.err
}

func (h *poisoningHooks) before(u, first int) error {
	if u == first {
		h.next = first
	}
	if h.open != -1 || u != h.next {
		return h.fail("unit %d opened with unit %d open, unit %d expected", u, h.open, h.next)
	}
	h.open = u
	h.be.Upload(h.pbuf[u], h.master[h.units[u].Lo:h.units[u].Hi])
	return nil
}

func (h *poisoningHooks) after(u, next int) error {
	if h.open != u {
		return h.fail("unit %d closed while unit %d is open", u, h.open)
	}
	h.open, h.next = -1, next
	h.poison(h.pbuf[u])
	return nil
}

func (h *poisoningHooks) BeforeForward(u int) error { return h.before(u, 0) }

func (h *poisoningHooks) AfterForward(u int) error { return h.after(u, u+1) }

func (h *poisoningHooks) BeforeBackward(u int) error {
	if err := h.before(u, len(h.units)-1); err != nil {
		return err
	}
	h.be.Zero(h.gbuf[u])
	return nil
}

func (h *poisoningHooks) AfterBackward(u int) error {
	g := make([]float32, h.gbuf[u].Len)
	h.be.Download(g, h.gbuf[u])
	for i, v := range g {
		h.grads[h.units[u].Lo+i] += v
	}
	h.poison(h.gbuf[u])
	return h.after(u, u-1)
}

func (h *poisoningHooks) done() error {
	if h.open != -1 {
		h.fail("unit %d left open", h.open)
	}
	return h.err
}

// TestActivationBytes: the plan of each policy for tiny_bench at B=8,
// T=256 has the expected size, per-layer term by term, and full <
// selective 2 < none; a model built with a policy reports its plan.
func TestActivationBytes(t *testing.T) {
	cfg, _ := Flavor("tiny_bench")
	const B, T = 8, 256
	L, BT, D, F, V := cfg.NLayers, B*T, cfg.Dim, cfg.FFNHidden(), cfg.VocabSize
	Q, KV, H := cfg.NHeads*cfg.HeadDim(), cfg.KVHeads()*cfg.HeadDim(), cfg.NHeads
	// Everything one layer keeps; what the per-operation policy keeps
	// (q, v, the attention's output and log-sum-exp, w1·x) and what it
	// recomputes (both norms with their 1/rms, k, the residual after
	// attention, w3·x, the SwiGLU product).
	set := BT*(3*D+2+2*Q+2*KV+3*F) + B*H*T
	kept := BT*(2*Q+KV+F) + B*H*T
	cheap := BT * (3*D + 2 + KV + 2*F)
	if kept+cheap != set {
		t.Fatalf("op split %d + %d does not add up to %d", kept, cheap, set)
	}
	common := (L+1)*BT*D + BT*D + BT + BT*V + 3*BT + BT + BT*(2*D+3*Q+3*KV+3*F)
	want := map[string]int{
		"none":         common + L*set,
		"full":         common + set,
		"selective 1":  common + set,
		"selective 2":  common + (L-L/2)*set + set,
		"selective 5":  common + L*set, // no layer is the 5th
		"selective op": common + L*kept + cheap,
	}
	got := map[string]int64{}
	for _, ac := range []ActivationCheckpoint{
		{}, {Mode: "full"}, {Mode: "selective", SelectiveOption: "1"}, {Mode: "selective", SelectiveOption: "2"},
		{Mode: "selective", SelectiveOption: "5"}, {Mode: "selective", SelectiveOption: "op"},
	} {
		n, err := ActivationBytesFor(cfg, B, T, Plan{Checkpoint: ac})
		if err != nil {
			t.Fatal(err)
		}
		got[ac.String()] = n
		if w := int64(want[ac.String()]) * 4; n != w {
			t.Errorf("%v: %d activation bytes, want %d", ac, n, w)
		}
		t.Logf("tiny_bench B=%d T=%d %-12v %8.2f MiB", B, T, ac, float64(n)/(1<<20))
	}
	if !(got["full"] < got["selective 2"] && got["selective 2"] < got["none"] && got["selective op"] < got["none"]) {
		t.Errorf("activation bytes not ordered full < selective 2 < none, op < none: %v", got)
	}

	tiny, _ := Flavor("tiny")
	be := cpu.New(1)
	defer be.Close()
	for _, ac := range acModes {
		m, err := New(be, tiny, 2, 8, Plan{Checkpoint: ac})
		if err != nil {
			t.Fatal(err)
		}
		want, _ := ActivationBytesFor(tiny, 2, 8, Plan{Checkpoint: ac})
		if m.ActivationBytes() != want {
			t.Errorf("%v: model has %d activation bytes, plan %d", ac, m.ActivationBytes(), want)
		}
	}
}

func TestCheckpointingRejectsBadOptions(t *testing.T) {
	tiny, _ := Flavor("tiny")
	for _, ac := range []ActivationCheckpoint{
		{Mode: "memory_budget"}, {Mode: "selective"}, {Mode: "selective", SelectiveOption: "0"},
		{Mode: "selective", SelectiveOption: "ops"},
	} {
		if _, err := ActivationBytesFor(tiny, 1, 4, Plan{Checkpoint: ac}); err == nil {
			t.Errorf("%+v was accepted", ac)
		}
	}
}
