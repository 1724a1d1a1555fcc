package llama

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/optim"
)

func TestPublishedParameterCounts(t *testing.T) {
	for _, tc := range []struct {
		flavor string
		want   int64
	}{
		{"debug", 6_163_712},
		// Llama 3.2 1B: 1,235,814,400 published (tied embeddings) plus
		// the untied output layer, 128256 × 2048.
		{"1B", 1_498_482_688},
		{"8B", 8_030_261_248},
		{"70B", 70_553_706_496},
		{"405B", 405_853_388_800},
	} {
		c, err := Flavor(tc.flavor)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.NumParams(); got != tc.want {
			t.Errorf("%s: %d parameters, want %d", tc.flavor, got, tc.want)
		}
		layout := c.Layout()
		last := layout[len(layout)-1]
		if int64(last.Offset+last.Size) != tc.want {
			t.Errorf("%s: layout covers %d elements, want %d", tc.flavor, last.Offset+last.Size, tc.want)
		}
	}
	// torchtitan's FLOPs per token for 8B at seq 8192 is about 57.91 GFLOP.
	c, _ := Flavor("8B")
	if f := c.FLOPsPerToken(8192) / 1e9; math.Abs(f-57.91) > 0.01 {
		t.Errorf("8B FLOPs/token at 8192 = %.3f GFLOP, want 57.91", f)
	}
}

func TestUnknownFlavor(t *testing.T) {
	if _, err := Flavor("7B"); err == nil {
		t.Fatal("want an error for an unknown flavor")
	}
}

func TestInitIsShardable(t *testing.T) {
	cfg, _ := Flavor("tiny")
	full := make([]float32, cfg.NumParams())
	InitParams(cfg, 7, full, 0)
	for _, cut := range [][2]int{{0, 100}, {1000, 3000}, {len(full) - 77, len(full)}} {
		part := make([]float32, cut[1]-cut[0])
		InitParams(cfg, 7, part, cut[0])
		for i := range part {
			if part[i] != full[cut[0]+i] {
				t.Fatalf("shard [%d,%d) element %d differs from the full init", cut[0], cut[1], i)
			}
		}
	}
	// Statistics of the embedding (std 1) and a depth-scaled projection.
	emb := paramSlice(full, cfg.Layout()[0])
	if s := std(emb); math.Abs(s-1) > 0.1 {
		t.Errorf("embedding std %.3f, want about 1", s)
	}
}

func std(x []float32) float64 {
	var s, s2 float64
	for _, v := range x {
		s += float64(v)
		s2 += float64(v) * float64(v)
	}
	n := float64(len(x))
	return math.Sqrt(s2/n - (s/n)*(s/n))
}

func TestPyTorchParity(t *testing.T) {
	ref := loadReference(t, "testdata/llama_tiny_reference.bin")
	cfg := ref.llamaConfig()
	if cfg.FFNHidden() != ref.Config.FFNHidden {
		t.Fatalf("ffn hidden %d, golden file says %d", cfg.FFNHidden(), ref.Config.FFNHidden)
	}
	tiny, _ := Flavor("tiny")
	tiny.MaxSeqLen = cfg.MaxSeqLen
	if tiny != cfg {
		t.Errorf("flavor tiny %+v differs from the golden file's config %+v", tiny, cfg)
	}
	cos, sin := cfg.RoPETables(ref.Config.SeqLen)
	checkClose(t, "rope cos", cos, ref.f32["freqs_cos"], 1e-6)
	checkClose(t, "rope sin", sin, ref.f32["freqs_sin"], 1e-6)

	for _, chunk := range []int{cfg.VocabSize, 7} {
		be := cpu.New(2)
		m, err := New(be, cfg, ref.Config.Batch, ref.Config.SeqLen, Plan{LogitChunk: chunk})
		if err != nil {
			t.Fatal(err)
		}
		be.Upload(m.Params, ref.flatParams(t, cfg, "params/"))
		tokens, targets := ref.i32["tokens"], ref.i32["targets"]
		loss, err := m.Forward(tokens, targets)
		if err != nil {
			t.Fatal(err)
		}
		checkClose(t, "loss", []float32{loss}, ref.f32["loss"], 1e-5)
		if chunk == cfg.VocabSize {
			logits := make([]float32, m.B*m.T*cfg.VocabSize)
			if err := m.Logits(logits); err != nil {
				t.Fatal(err)
			}
			checkClose(t, "logits", logits, ref.f32["logits"], 1e-5)
		}
		m.ZeroGrad()
		if err := m.Backward(1 / float32(m.NumTargets())); err != nil {
			t.Fatal(err)
		}
		grads := make([]float32, m.Grads.Len)
		be.Download(grads, m.Grads)
		for _, p := range cfg.Layout() {
			checkClose(t, "grad "+p.Name, paramSlice(grads, p), ref.f32["grads/"+p.Name], 1e-5)
		}

		// Ten AdamW steps with gradient clipping on the same batch.
		rc := ref.Config
		opt := optim.NewAdamW(be, m.Params.Len, optim.AdamWConfig{
			LR: float32(rc.LR), Beta1: float32(rc.Beta1), Beta2: float32(rc.Beta2), Eps: float32(rc.Eps), WeightDecay: float32(rc.WeightDecay),
		})
		for step := 0; step < rc.Steps; step++ {
			loss, err := m.Forward(tokens, targets)
			if err != nil {
				t.Fatal(err)
			}
			checkClose(t, "loss of step", []float32{loss}, ref.f32["losses"][step:step+1], 1e-5)
			m.ZeroGrad()
			if err := m.Backward(1 / float32(m.NumTargets())); err != nil {
				t.Fatal(err)
			}
			norm, scale := optim.ClipScale(be.SumSquares(m.Grads), float32(rc.MaxNorm))
			checkClose(t, "grad norm of step", []float32{float32(norm)}, ref.f32["grad_norms"][step:step+1], 1e-5)
			if err := opt.Update(m.Params, m.Grads, float32(rc.LR), scale); err != nil {
				t.Fatal(err)
			}
		}
		after := make([]float32, m.Params.Len)
		be.Download(after, m.Params)
		for _, p := range cfg.Layout() {
			checkClose(t, "params after 10 steps "+p.Name, paramSlice(after, p), ref.f32["params_after/"+p.Name], 1e-5)
		}
		be.Close()
	}
	for _, cat := range []string{"logits", "loss", "grad", "params"} {
		t.Logf("%-7s worst relative error: %.2g (L2), %.2g (max)", cat, worst[cat][0], worst[cat][1])
	}
}

// TestModelGradientFiniteDifferences checks the whole model's gradient
// along random directions against central differences of the loss.
func TestModelGradientFiniteDifferences(t *testing.T) {
	cfg, _ := Flavor("tiny")
	be := cpu.New(1)
	defer be.Close()
	B, T := 2, 8
	m, err := New(be, cfg, B, T, Plan{})
	if err != nil {
		t.Fatal(err)
	}
	m.Init(3)
	// Larger weights than the init so every path carries signal.
	p0 := make([]float32, m.Params.Len)
	be.Download(p0, m.Params)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range p0 {
		p0[i] += float32(r.NormFloat64() * 0.1)
	}
	be.Upload(m.Params, p0)
	tokens, targets := make([]int32, B*T), make([]int32, B*T)
	for i := range tokens {
		tokens[i] = int32(r.IntN(cfg.VocabSize))
		targets[i] = int32(r.IntN(cfg.VocabSize))
	}
	targets[3] = -1 // an ignored position
	if _, err := m.Forward(tokens, targets); err != nil {
		t.Fatal(err)
	}
	m.ZeroGrad()
	if err := m.Backward(1 / float32(m.NumTargets())); err != nil {
		t.Fatal(err)
	}
	g := make([]float32, m.Grads.Len)
	be.Download(g, m.Grads)

	lossAt := func(p []float32) float64 {
		be.Upload(m.Params, p)
		l, err := m.Forward(tokens, targets)
		if err != nil {
			t.Fatal(err)
		}
		return float64(l)
	}
	// One random direction over all parameters, then one per parameter tensor.
	dirs := [][2]int{{0, len(p0)}}
	for _, p := range cfg.Layout() {
		dirs = append(dirs, [2]int{p.Offset, p.Offset + p.Size})
	}
	const eps = 1e-2
	for _, span := range dirs {
		d := make([]float32, len(p0))
		var gd, dn float64
		for i := span[0]; i < span[1]; i++ {
			d[i] = float32(r.NormFloat64())
			gd += float64(d[i]) * float64(g[i])
			dn += float64(d[i]) * float64(d[i])
		}
		scale := 1 / math.Sqrt(dn)
		plus, minus := make([]float32, len(p0)), make([]float32, len(p0))
		for i := range p0 {
			plus[i] = p0[i] + float32(eps*scale)*d[i]
			minus[i] = p0[i] - float32(eps*scale)*d[i]
		}
		fd := (lossAt(plus) - lossAt(minus)) / (2 * eps)
		an := gd * scale
		if math.Abs(fd-an) > 2e-3*math.Max(1e-2, math.Abs(an))+2e-4 {
			t.Errorf("directional derivative over [%d,%d): finite difference %.6g, backward %.6g", span[0], span[1], fd, an)
		}
	}
}

func TestForwardRejectsBadTokens(t *testing.T) {
	cfg, _ := Flavor("tiny")
	be := cpu.New(1)
	defer be.Close()
	m, _ := New(be, cfg, 1, 4, Plan{})
	if _, err := m.Forward([]int32{0, 1, 2, 64}, nil); err == nil {
		t.Error("token == vocab size must be refused")
	}
	if _, err := m.Forward([]int32{0, 1}, nil); err == nil {
		t.Error("wrong token count must be refused")
	}
	if _, err := New(be, cfg, 1, cfg.MaxSeqLen+1, Plan{}); err == nil {
		t.Error("seq_len beyond max_seq_len must be refused")
	}
}

var _ backend.Backend = (*cpu.Backend)(nil)

// TestPassFLOPs: the whole model's forward, input-gradient and
// weight-gradient FLOPs without checkpointing add up to torchtitan's
// FLOPsPerToken less its norms and half its (uncausal) attention term;
// stages add up to the whole model; the head adds its product to each
// pass; each policy adds what it recomputes, counted within the stage,
// to the input gradient alone.
func TestPassFLOPs(t *testing.T) {
	cfg, err := Flavor("8B")
	if err != nil {
		t.Fatal(err)
	}
	const T = 8192
	L, D, V := float64(cfg.NLayers), float64(cfg.Dim), float64(cfg.VocabSize)
	none := ActivationCheckpoint{}
	f, i, w := cfg.PassFLOPs(T, none, whole(cfg))
	want := cfg.FLOPsPerToken(T) - 6*(2*L+1)*D - 6*L*D*T
	if got := f + i + w; math.Abs(got/want-1) > 1e-12 {
		t.Errorf("passes sum to %g FLOPs a token, want %g", got, want)
	}
	// One layer without the head, and the head alone.
	lf, li, lw := cfg.PassFLOPs(T, none, StageSpec{FirstLayer: 3, NumLayers: 1})
	if lw >= lf || li <= lf {
		t.Errorf("a layer's forward %g, input %g, weight %g: want weight < forward < input (attention)", lf, li, lw)
	}
	hf, hi, hw := cfg.PassFLOPs(T, none, StageSpec{FirstLayer: int(L), Head: true})
	if h := 2 * V * D; hf != h || hi != h || hw != h {
		t.Errorf("the head alone: %g, %g, %g; want %g each", hf, hi, hw, h)
	}
	// Two stages of 20 and 12 layers, the head on the second.
	af, ai, aw := cfg.PassFLOPs(T, none, StageSpec{NumLayers: 20, Embedding: true})
	bf, bi, bw := cfg.PassFLOPs(T, none, StageSpec{FirstLayer: 20, NumLayers: 12, Head: true})
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"forward", af + bf, f}, {"input", ai + bi, i}, {"weight", aw + bw, w},
		{"first stage's forward", af, 20 * lf}, {"second stage's input", bi, 12*li + hi},
	} {
		if math.Abs(c.got/c.want-1) > 1e-12 {
			t.Errorf("%s: %g, want %g", c.name, c.got, c.want)
		}
	}
	F, KV := float64(cfg.FFNHidden()), float64(cfg.KVHeads()*cfg.HeadDim())
	stage := StageSpec{FirstLayer: 10, NumLayers: 10}
	for _, c := range []struct {
		ac    ActivationCheckpoint
		extra float64 // recomputed FLOPs in the stage's input gradient
	}{
		{ActivationCheckpoint{Mode: "full"}, 10 * lf},
		{ActivationCheckpoint{Mode: "selective", SelectiveOption: "2"}, 5 * lf},
		{ActivationCheckpoint{Mode: "selective", SelectiveOption: "3"}, 3 * lf}, // the stage's 3rd, 6th and 9th layers
		{ActivationCheckpoint{Mode: "selective", SelectiveOption: "op"}, 10 * 2 * (KV*D + D*D + F*D)},
	} {
		f0, i0, w0 := cfg.PassFLOPs(T, none, stage)
		f2, i2, w2 := cfg.PassFLOPs(T, c.ac, stage)
		if f2 != f0 || w2 != w0 || math.Abs((i2-i0)/c.extra-1) > 1e-12 {
			t.Errorf("%v: forward %g, input %g, weight %g; want %g, %g + %g, %g", c.ac, f2, i2, w2, f0, i0, c.extra, w0)
		}
	}
}
