package hyena

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/model"
)

var _ model.Part = part{}

// wholeRun runs the whole model once on params and returns its loss, the
// loss scale it used and its gradient (of the mean loss).
func wholeRun(t *testing.T, be backend.Backend, c Config, B, T int, params []float32, tokens, targets []int32) (loss, scale float32, grads []float32) {
	t.Helper()
	m, err := New(be, c, B, T, Options{})
	if err != nil {
		t.Fatal(err)
	}
	be.Upload(m.Params, params)
	m.ZeroGrad()
	if loss, err = m.Forward(tokens, targets); err != nil {
		t.Fatal(err)
	}
	scale = 1 / float32(m.NumTargets())
	if err := m.Backward(scale); err != nil {
		t.Fatal(err)
	}
	grads = make([]float32, len(params))
	be.Download(grads, m.Grads)
	return loss, scale, grads
}

// TestCausality: changing token j changes no logit before position j (nor
// any logit of the other rows) and changes the logits from j on, for
// orders 2 and 3. With the direct long convolution the earlier logits
// are bitwise equal; the bound leaves room for an FFT convolution.
func TestCausality(t *testing.T) {
	be := newBackend(t)
	for _, order := range []int{2, 3} {
		c := testConfig(order)
		const B, T = 2, 9
		m, err := New(be, c, B, T, Options{LogitChunk: c.PaddedVocab()})
		if err != nil {
			t.Fatal(err)
		}
		be.Upload(m.Params, randomParams(c, 11))
		tokens, _ := batch(c, B*T, 4)
		V := c.PaddedVocab()
		logits := func(tok []int32) []float32 {
			if _, err := m.Forward(tok, nil); err != nil {
				t.Fatal(err)
			}
			out := make([]float32, B*T*V)
			if err := m.Logits(out); err != nil {
				t.Fatal(err)
			}
			return out
		}
		base := logits(tokens)
		for _, j := range []int{0, 4, T - 1} {
			changed := slices.Clone(tokens)
			changed[T+j] = (changed[T+j] + 1) % int32(c.VocabSize) // row 1
			got := logits(changed)
			var before, after, scale float64
			for i := range got {
				d := math.Abs(float64(got[i]) - float64(base[i]))
				scale = math.Max(scale, math.Abs(float64(base[i])))
				if row, pos := i/(T*V), i/V%T; row == 1 && pos >= j {
					after = math.Max(after, d)
				} else {
					before = math.Max(before, d)
				}
			}
			if before > 1e-6*scale {
				t.Errorf("order %d, token %d changed: logits before it (or in the other row) moved by %.3g", order, j, before)
			}
			if after == 0 {
				t.Errorf("order %d, token %d changed: no logit from it on moved", order, j)
			}
		}
	}
}

// stageBuffer is one stage's own flat buffer assembled from the whole
// model's: the tied copy of the embedding, then the stage's range.
func stageBuffer(c Config, s StageSpec, whole []float32) []float32 {
	var out []float32
	for _, p := range c.StageLayout(s) {
		out = append(out, whole[p.Offset:p.Offset+p.Size]...)
	}
	return out
}

// TestStagesChainLikeTheModel: the model cut into pipeline stages, hidden
// states handed forward through Input and gradients backward through
// GradOutput/GradInput, gives the whole model's loss bitwise and its
// gradients: bitwise, except the embedding's, which is the sum of the
// first stage's (the lookup) and the head stage's tied copy's (the head)
// and equals the whole model's up to the order of that sum.
func TestStagesChainLikeTheModel(t *testing.T) {
	be := newBackend(t)
	for _, tc := range []struct {
		order int
		cuts  []int // layers per stage (the model has 3)
	}{
		{2, []int{1, 2}},
		{3, []int{2, 1}},
		{3, []int{1, 1, 1}},
		{2, []int{3, 0}}, // a head stage with no layers
	} {
		t.Run(fmt.Sprintf("order %d cuts %v", tc.order, tc.cuts), func(t *testing.T) {
			c := testConfig(tc.order)
			c.NLayer = 3
			const B, T = 2, 6
			params := randomParams(c, 21)
			tokens, targets := batch(c, B*T, 8)
			refLoss, scale, want := wholeRun(t, be, c, B, T, params, tokens, targets)

			var stages []*Model
			var grads []backend.Tensor
			first := 0
			for i, n := range tc.cuts {
				spec := StageSpec{FirstLayer: first, NumLayers: n, Embedding: i == 0, Head: i == len(tc.cuts)-1}
				first += n
				s, err := New(be, c, B, T, Options{Stage: &spec, External: true})
				if err != nil {
					t.Fatal(err)
				}
				buf := stageBuffer(c, spec, params)
				p, g := be.Alloc(backend.Float32, len(buf)), be.Alloc(backend.Float32, len(buf))
				be.Upload(p, buf)
				s.Bind(p, g)
				stages, grads = append(stages, s), append(grads, g)
			}
			for i, s := range stages {
				if i > 0 {
					be.Copy(s.Input(), stages[i-1].Output())
				}
				if _, err := s.Forward(tokens, targets); err != nil {
					t.Fatal(err)
				}
			}
			last := stages[len(stages)-1]
			if got := float32(last.LossSum() / float64(last.NumTargets())); got != refLoss {
				t.Errorf("loss %v, whole model %v", got, refLoss)
			}
			for i := len(stages) - 1; i >= 0; i-- {
				if i < len(stages)-1 {
					be.Copy(stages[i].GradOutput(), stages[i+1].GradInput())
				}
				if err := stages[i].Backward(scale); err != nil {
					t.Fatal(err)
				}
			}
			// Assemble the whole gradient: each stage's range, plus the
			// tied copy's gradient onto the embedding's.
			got := make([]float32, len(want))
			wte := c.Layout()[0]
			for i, s := range stages {
				g := make([]float32, grads[i].Len)
				be.Download(g, grads[i])
				for _, p := range s.Layout {
					src := g[p.LocalOffset : p.LocalOffset+p.Size]
					dst := got[p.Offset : p.Offset+p.Size]
					for k, v := range src {
						dst[k] += v
					}
				}
			}
			for _, p := range c.Layout() {
				g, w := got[p.Offset:p.Offset+p.Size], want[p.Offset:p.Offset+p.Size]
				if p.Name == wte.Name {
					if l2, mx := relErr(g, w); l2 > 1e-6 || mx > 1e-5 {
						t.Errorf("%s: relative error %.3g (L2), %.3g (max)", p.Name, l2, mx)
					}
					continue
				}
				for k := range g {
					if g[k] != w[k] {
						t.Fatalf("%s[%d]: %v, whole model %v", p.Name, k, g[k], w[k])
					}
				}
			}
		})
	}
}

// event is one unit hook call.
type event struct {
	kind string // "BF", "AF", "BB", "AB"
	unit int
}

func (e event) String() string { return fmt.Sprintf("%s%d", e.kind, e.unit) }

// poisoningHooks bind each unit's parameters only between its Before and
// After hooks (NaN outside), and a zeroed gradient buffer during its
// backward that AfterBackward adds into grads, so that a computation
// outside its unit's hooks poisons the result. They record the calls.
type poisoningHooks struct {
	be     backend.Backend
	m      *Model
	master []float32
	grads  []float32
	nan    []backend.Tensor
	gbuf   []backend.Tensor
	events []event
}

func newPoisoningHooks(be backend.Backend, m *Model, master []float32) *poisoningHooks {
	h := &poisoningHooks{be: be, m: m, master: master, grads: make([]float32, len(master))}
	for u, r := range m.Units() {
		nan := make([]float32, r.Len())
		for i := range nan {
			nan[i] = float32(math.NaN())
		}
		t := be.Alloc(backend.Float32, r.Len())
		be.Upload(t, nan)
		h.nan = append(h.nan, t)
		h.gbuf = append(h.gbuf, be.Alloc(backend.Float32, r.Len()))
		m.BindUnit(u, t, t)
	}
	return h
}

func (h *poisoningHooks) params(u int) backend.Tensor {
	r := h.m.Units()[u]
	t := h.be.Alloc(backend.Float32, r.Len())
	h.be.Upload(t, h.master[r.Lo:r.Hi])
	return t
}

func (h *poisoningHooks) BeforeForward(u int) error {
	h.events = append(h.events, event{"BF", u})
	h.m.BindUnit(u, h.params(u), backend.Tensor{})
	return nil
}

func (h *poisoningHooks) AfterForward(u int) error {
	h.events = append(h.events, event{"AF", u})
	h.m.BindUnit(u, h.nan[u], backend.Tensor{})
	return nil
}

func (h *poisoningHooks) BeforeBackward(u int) error {
	h.events = append(h.events, event{"BB", u})
	h.be.Zero(h.gbuf[u])
	h.m.BindUnit(u, h.params(u), h.gbuf[u])
	return nil
}

func (h *poisoningHooks) AfterBackward(u int) error {
	h.events = append(h.events, event{"AB", u})
	r := h.m.Units()[u]
	g := make([]float32, r.Len())
	h.be.Download(g, h.gbuf[u])
	for i, v := range g {
		h.grads[r.Lo+i] += v
	}
	h.m.BindUnit(u, h.nan[u], h.nan[u])
	return nil
}

// TestUnitHooks: Forward calls the hooks of the embedding, each layer and
// the final norm in increasing order and then the embedding's again for
// the tied head; Backward calls them in exactly the reverse order. With
// every unit's parameters bound only inside its hooks (and a separate
// gradient buffer per backward visit, as FSDP does), the loss and the
// gradients are those of the model with its own buffers: the embedding
// gradient being the sum of the head's and the lookup's visits.
func TestUnitHooks(t *testing.T) {
	be := newBackend(t)
	for _, order := range []int{2, 3} {
		c := testConfig(order)
		const B, T = 2, 5
		params := randomParams(c, 31)
		tokens, targets := batch(c, B*T, 9)
		refLoss, scale, want := wholeRun(t, be, c, B, T, params, tokens, targets)

		m, err := New(be, c, B, T, Options{External: true})
		if err != nil {
			t.Fatal(err)
		}
		h := newPoisoningHooks(be, m, params)
		part{m}.SetHooks(h)
		loss, err := m.Forward(tokens, targets)
		if err != nil {
			t.Fatal(err)
		}
		if loss != refLoss {
			t.Errorf("order %d: loss %v, model with its own buffers %v", order, loss, refLoss)
		}
		if err := m.Backward(scale); err != nil {
			t.Fatal(err)
		}
		var wantEvents []string
		n := len(m.Units())
		for u := 0; u < n; u++ {
			wantEvents = append(wantEvents, fmt.Sprintf("BF%d", u), fmt.Sprintf("AF%d", u))
		}
		wantEvents = append(wantEvents, "BF0", "AF0", "BB0", "AB0")
		for u := n - 1; u >= 0; u-- {
			wantEvents = append(wantEvents, fmt.Sprintf("BB%d", u), fmt.Sprintf("AB%d", u))
		}
		got := make([]string, len(h.events))
		for i, e := range h.events {
			got[i] = e.String()
		}
		if strings.Join(got, " ") != strings.Join(wantEvents, " ") {
			t.Errorf("order %d: hooks\n %v\nwant\n %v", order, got, wantEvents)
		}
		wte := c.Layout()[0]
		if l2, mx := relErr(h.grads[:wte.Size], want[:wte.Size]); l2 > 1e-6 || mx > 1e-5 {
			t.Errorf("order %d: embedding gradient relative error %.3g (L2), %.3g (max)", order, l2, mx)
		}
		for i := wte.Size; i < len(want); i++ {
			if h.grads[i] != want[i] {
				t.Fatalf("order %d: gradient %d is %v, model with its own buffers %v", order, i, h.grads[i], want[i])
			}
		}
	}
}

// TestFamily: the model family refuses tensor and context parallelism,
// sequences longer than l_max and a head stage without the embedding,
// and builds a whole-model part of the family's layout.
func TestFamily(t *testing.T) {
	be := newBackend(t)
	c := testConfig(2)
	f := Family{Cfg: c}
	for _, tc := range []struct {
		T, tp, cp int
		want      string
	}{
		{8, 2, 1, "parallelism.tensor_parallel_degree 2: tensor parallelism is not supported for hyena yet"},
		{8, 1, 2, "parallelism.context_parallel_degree 2: context parallelism is not supported for hyena yet"},
		{c.LMax + 1, 1, 1, "l_max"},
	} {
		err := f.Check(tc.T, tc.tp, tc.cp)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check(%d, %d, %d) = %v, want an error mentioning %q", tc.T, tc.tp, tc.cp, err, tc.want)
		}
	}
	if err := f.Check(c.LMax, 1, 1); err != nil {
		t.Errorf("Check(l_max, 1, 1) = %v", err)
	}
	if _, err := f.NewPart(be, 1, 4, model.Placement{TP: 2, Stage: c.Whole()}); err == nil {
		t.Error("NewPart accepted tensor parallelism")
	}
	// A head stage without the embedding starts with its copy of it.
	head := StageSpec{FirstLayer: 1, NumLayers: 1, Head: true}
	hp, err := f.NewPart(be, 1, 4, model.Placement{Stage: head})
	if err != nil {
		t.Fatal(err)
	}
	wte := c.Layout()[0]
	cp := f.Copies(head, 1)
	if len(cp) != 1 || cp[0].Local != (model.Range{Lo: 0, Hi: wte.Size}) || cp[0].Source != (model.Range{Lo: wte.Offset, Hi: wte.Offset + wte.Size}) || hp.Units()[0] != cp[0].Local {
		t.Errorf("head stage copies %+v, units %v; want the embedding's copy as unit 0", cp, hp.Units())
	}
	if got := f.Copies(c.Whole(), 1); got != nil {
		t.Errorf("the whole model has copies %+v", got)
	}
	p, err := f.NewPart(be, 2, 4, model.Placement{TP: 1, CP: 1, Stage: c.Whole()})
	if err != nil {
		t.Fatal(err)
	}
	us := p.Units()
	if f.ShardLen(1) != int(c.NumParams()) || us[len(us)-1].Hi != f.ShardLen(1) || len(us) != c.NLayer+2 {
		t.Errorf("part units %v for a flat buffer of %d", us, f.ShardLen(1))
	}
	first := StageSpec{FirstLayer: 0, NumLayers: 1, Embedding: true}
	if r := f.StageRange(first, 1); r.Lo != 0 || r.Hi != us[2].Lo {
		t.Errorf("StageRange(%+v) = %v, want [0, %d)", first, r, us[2].Lo)
	}
	x := []int32{1, 2, 3}
	if got := f.Rows(x, 3, 1, 0); !slices.Equal(got, x) {
		t.Errorf("Rows = %v", got)
	}
	a := make([]float32, 50)
	f.Init(5, 1, 0, 1000, a)
	b := make([]float32, 1050)
	InitParams(c, 5, b, 0)
	if !slices.Equal(a, b[1000:]) {
		t.Error("Family.Init differs from InitParams")
	}
}
