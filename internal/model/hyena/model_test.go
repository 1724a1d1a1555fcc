package hyena

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
)

// testConfig is a small model of the given order for the tests: every
// dimension distinct, so that a mixed-up index shows.
func testConfig(order int) Config {
	c := defaults()
	c.DModel, c.NLayer, c.DInner, c.VocabSize = 8, 2, 12, 13
	c.Order, c.EmbDim, c.FilterOrder, c.LMax = order, 5, 6, 11
	return c
}

func newBackend(t testing.TB) *cpu.Backend {
	t.Helper()
	be := cpu.New(2)
	t.Cleanup(be.Close)
	return be
}

// randomParams returns a whole-model flat buffer of moderate random
// values (weights of all sizes, norms near 1, frequencies near 1), so
// that every parameter's gradient is well away from zero.
func randomParams(c Config, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 17))
	flat := make([]float32, c.NumParams())
	for _, p := range c.Layout() {
		v := flat[p.Offset : p.Offset+p.Size]
		base, std := 0.0, 0.4
		switch {
		case strings.Contains(p.Name, "norm") || strings.HasPrefix(p.Name, "ln_f.weight"):
			if strings.HasSuffix(p.Name, "weight") {
				base, std = 1, 0.2
			}
		case strings.HasSuffix(p.Name, ".freq"):
			base, std = 1.5, 0.3
		case strings.HasSuffix(p.Name, ".weight") && len(p.Shape) == 2:
			std = 1 / math.Sqrt(float64(p.Shape[1]))
		}
		for i := range v {
			v[i] = float32(base + std*r.NormFloat64())
		}
	}
	return flat
}

// batch returns n random tokens and targets (some ignored).
func batch(c Config, n int, seed uint64) (tokens, targets []int32) {
	r := rand.New(rand.NewPCG(seed, 3))
	tokens, targets = make([]int32, n), make([]int32, n)
	for i := range tokens {
		tokens[i] = int32(r.IntN(c.VocabSize))
		targets[i] = int32(r.IntN(c.VocabSize))
	}
	targets[n/2] = -1
	return tokens, targets
}

func TestFlavors(t *testing.T) {
	for _, tc := range []struct {
		flavor string
		params int64
		vocab  int
	}{
		{"tiny", 7_216, 64},
		{"debug", 361_664, 2048},
		// The narrow long-filter model of titan bench generate.
		{"long", 1_355_744, 512},
		// safari's hyena-small: about 153M with the tied embedding.
		{"small", 153_700_416, 50264},
	} {
		c, err := Flavor(tc.flavor)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.NumParams(); got != tc.params {
			t.Errorf("%s: %d parameters, want %d", tc.flavor, got, tc.params)
		}
		lay := c.Layout()
		if last := lay[len(lay)-1]; int64(last.Offset+last.Size) != tc.params {
			t.Errorf("%s: the layout covers %d elements, want %d", tc.flavor, last.Offset+last.Size, tc.params)
		}
		if c.PaddedVocab() != tc.vocab {
			t.Errorf("%s: padded vocabulary %d, want %d", tc.flavor, c.PaddedVocab(), tc.vocab)
		}
	}
	s, _ := Flavor("small")
	if s.DModel != 864 || s.NLayer != 18 || s.Inner() != 1728 || s.EmbDim != 33 || s.FilterOrder != 64 || s.W != 14 || s.LMax != 2048 || s.Order != 2 || s.ShortFilterOrder != 3 {
		t.Errorf("small flavor %+v differs from safari's hyena-small", s)
	}
	if _, err := Flavor("medium"); err == nil {
		t.Error("want an error for an unknown flavor")
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"order 1", func(c *Config) { c.Order = 1 }, "order"},
		{"even emb_dim", func(c *Config) { c.EmbDim = 4 }, "emb_dim"},
		{"no l_max", func(c *Config) { c.LMax = 0 }, "l_max"},
		{"no filter", func(c *Config) { c.FilterOrder = 0 }, "filter_order"},
	} {
		c := testConfig(2)
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
}

// TestLayout: the units tile the buffer (embedding, each layer, final
// norm), the names follow safari's, and stages hold contiguous ranges.
func TestLayout(t *testing.T) {
	c := testConfig(3)
	lay := c.Layout()
	names := map[string]bool{}
	for _, p := range lay {
		names[p.Name] = true
	}
	for _, n := range []string{
		"wte.weight", "layers.1.mixer.filter_fn.implicit_filter.6.weight", "layers.0.mixer.filter_fn.implicit_filter.1.freq",
		"layers.0.mixer.filter_fn.pos_emb.z", "layers.1.mlp.fc2.bias", "ln_f.bias",
	} {
		if !names[n] {
			t.Errorf("layout lacks %s", n)
		}
	}
	if got := SafariName("layers.0.mixer.in_proj.weight"); got != "backbone.layers.0.mixer.in_proj.weight" {
		t.Errorf("SafariName = %q", got)
	}
	us := c.Units()
	if len(us) != c.NLayer+2 || us[0].Hi != c.PaddedVocab()*c.DModel || us[len(us)-1].Len() != 2*c.DModel || us[len(us)-1].Hi != int(c.NumParams()) {
		t.Fatalf("units %v", us)
	}
	for i := 1; i < len(us); i++ {
		if us[i].Lo != us[i-1].Hi {
			t.Fatalf("units %v do not tile the buffer", us)
		}
	}
	next := 0
	for i := range c.NLayer {
		r := c.StageRange(StageSpec{FirstLayer: i, NumLayers: 1, Embedding: i == 0, Head: i == c.NLayer-1})
		if r.Lo != next || r.Hi <= r.Lo {
			t.Fatalf("stage %d: range %v, want it to start at %d", i, r, next)
		}
		next = r.Hi
	}
	if next != int(c.NumParams()) {
		t.Fatalf("stages end at %d of %d", next, c.NumParams())
	}
	// A head stage without the embedding starts with its tied copy.
	hl := c.StageLayout(StageSpec{FirstLayer: 1, NumLayers: 1, Head: true})
	if !hl[0].Tied || hl[0].Name != "wte.weight" || hl[0].LocalOffset != 0 || hl[1].LocalOffset != hl[0].Size {
		t.Errorf("head stage layout starts %+v, %+v", hl[0], hl[1])
	}
}

func TestInitIsShardable(t *testing.T) {
	c, _ := Flavor("debug")
	full := make([]float32, c.NumParams())
	InitParams(c, 7, full, 0)
	for _, cut := range [][2]int{{0, 100}, {130000, 190000}, {len(full) - 77, len(full)}} {
		part := make([]float32, cut[1]-cut[0])
		InitParams(c, 7, part, cut[0])
		for i := range part {
			if part[i] != full[cut[0]+i] {
				t.Fatalf("shard [%d,%d) element %d differs from the full init", cut[0], cut[1], i)
			}
		}
	}
	get := func(name string) []float32 {
		for _, p := range c.Layout() {
			if p.Name == name {
				return full[p.Offset : p.Offset+p.Size]
			}
		}
		t.Fatalf("no %s", name)
		return nil
	}
	for _, tc := range []struct {
		name      string
		mean, std float64
	}{
		{"wte.weight", 0, 0.02},
		{"layers.1.mixer.in_proj.weight", 0, 0.02},
		{"layers.1.mixer.out_proj.weight", 0, 0.02 / math.Sqrt(8)},
		{"layers.2.mixer.filter_fn.bias", 0, 1},
		{"layers.0.mixer.short_filter.weight", 0, 1 / math.Sqrt(9)}, // U(-1/√3, 1/√3)
		{"layers.3.norm2.weight", 1, 0},
		{"layers.3.mlp.fc1.bias", 0, 0},
		{"layers.0.mixer.filter_fn.implicit_filter.1.freq", c.W, 0},
	} {
		x := get(tc.name)
		m, s := meanStd(x)
		// Four standard errors of the sample mean and deviation.
		n := float64(len(x))
		if math.Abs(m-tc.mean) > 4*tc.std/math.Sqrt(n)+1e-9 || math.Abs(s-tc.std) > 4*tc.std/math.Sqrt(2*n)+1e-9 {
			t.Errorf("%s: mean %.4g std %.4g, want %.4g and %.4g", tc.name, m, s, tc.mean, tc.std)
		}
	}
	z := get("layers.0.mixer.filter_fn.pos_emb.z")
	// Row k: t_k, cos(f_j w_k), -sin(f_j w_k); f = (1e-4, 1), w_k = 2πk/1024.
	k := 100
	w := 2 * math.Pi * float64(k) / 1024
	want := []float64{float64(k) / 1023, math.Cos(1e-4 * w), math.Cos(w), -math.Sin(1e-4 * w), -math.Sin(w)}
	for j, v := range want {
		if math.Abs(float64(z[k*5+j])-v) > 1e-7 {
			t.Errorf("z[%d][%d] = %v, want %v", k, j, z[k*5+j], v)
		}
	}
}

func meanStd(x []float32) (mean, std float64) {
	var s, s2 float64
	for _, v := range x {
		s += float64(v)
		s2 += float64(v) * float64(v)
	}
	n := float64(len(x))
	return s / n, math.Sqrt(math.Max(s2/n-(s/n)*(s/n), 0))
}

// lossOf runs m's forward on params and returns the loss sum.
func lossOf(t *testing.T, be backend.Backend, m *Model, params []float32, tokens, targets []int32) float64 {
	t.Helper()
	be.Upload(m.Params, params)
	if _, err := m.Forward(tokens, targets); err != nil {
		t.Fatal(err)
	}
	return m.LossSum()
}

// TestGradientsMatchFiniteDifferences: every parameter tensor's gradient
// (of the loss sum) against central finite differences of the float32
// model, Richardson-extrapolated (steps h and h/2) and with the losses
// summed in float64, at four elements per tensor, for orders 2 and 3.
// The error of an element is |g - fd| / max(|fd|, 0.1·max|g| over its
// tensor): relative, with a floor that keeps the float32 rounding noise
// of the differences (about 1e-5 of the loss) out of tiny elements.
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	be := newBackend(t)
	worst := 0.0
	for _, order := range []int{2, 3} {
		t.Run(fmt.Sprintf("order %d", order), func(t *testing.T) {
			c := testConfig(order)
			const B, T = 2, 7
			m, err := New(be, c, B, T, Options{})
			if err != nil {
				t.Fatal(err)
			}
			params := randomParams(c, uint64(order))
			tokens, targets := batch(c, B*T, 5)
			lossOf(t, be, m, params, tokens, targets)
			m.ZeroGrad()
			if err := m.Backward(1); err != nil {
				t.Fatal(err)
			}
			grads := make([]float32, len(params))
			be.Download(grads, m.Grads)
			r := rand.New(rand.NewPCG(9, uint64(order)))
			const h = 2.5e-2
			diff := func(i int, h float64) float64 {
				p := append([]float32(nil), params...)
				p[i] = params[i] + float32(h)
				hp := float64(p[i] - params[i])
				lp := lossOf(t, be, m, p, tokens, targets)
				p[i] = params[i] - float32(hp)
				lm := lossOf(t, be, m, p, tokens, targets)
				return (lp - lm) / (2 * hp)
			}
			for _, p := range c.Layout() {
				idx := []int{r.IntN(p.Size), r.IntN(p.Size), r.IntN(p.Size), r.IntN(p.Size)}
				if strings.HasSuffix(p.Name, "pos_emb.z") {
					// Rows at or past T are unused: their gradient is zero.
					idx = []int{r.IntN(T * c.EmbDim), r.IntN(T * c.EmbDim), r.IntN(T * c.EmbDim), T*c.EmbDim + r.IntN(p.Size-T*c.EmbDim)}
				}
				big := 0.0
				for _, g := range grads[p.Offset : p.Offset+p.Size] {
					big = math.Max(big, math.Abs(float64(g)))
				}
				for _, i := range idx {
					fd := (4*diff(p.Offset+i, h/2) - diff(p.Offset+i, h)) / 3
					g := float64(grads[p.Offset+i])
					e := math.Abs(g-fd) / math.Max(math.Abs(fd), 0.1*big)
					worst = math.Max(worst, e)
					if e > 2e-2 {
						t.Errorf("%s[%d]: gradient %.6g, finite difference %.6g (error %.2g; largest gradient of the tensor %.3g)", p.Name, i, g, fd, e, big)
					}
				}
			}
		})
	}
	t.Logf("largest finite-difference error %.3g", worst)
}
