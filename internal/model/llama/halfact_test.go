package llama

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/float8"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/numeric"
)

// TestHalfActivations: under bfloat16 mixed precision the activations
// only bfloat16 products read — both norm outputs, the SwiGLU product and
// attention's q, k and v of every layer — attention's output and the
// logits are bfloat16 tensors and every other one float32; the model's
// activation memory is the float32 model's less two bytes per element
// of them (the layers' kept per layer without checkpointing, once in the
// recomputation scratch under full checkpointing) plus the float32
// staging of the projections, and
// ActivationBytesFor plans exactly what New allocates. The products give the same bits from
// either (checked end to end: titan train's first-step losses are
// unchanged; the attention backward reads the rounded output, which
// moves later steps by about 2e-5 relative).
func TestHalfActivations(t *testing.T) {
	cfg := Config{Dim: 32, NLayers: 3, NHeads: 4, NKVHeads: 2, VocabSize: 61, MultipleOf: 16, NormEps: 1e-5, RoPETheta: 10000, MaxSeqLen: 16}
	const B, T = 2, 8
	be := cpu.New(1)
	defer be.Close()
	N, D, F := B*T, cfg.Dim, cfg.FFNHidden()
	Q, KV := cfg.NHeads*cfg.HeadDim(), cfg.KVHeads()*cfg.HeadDim()
	half := int64(2*N*D+N*F+2*N*Q+2*N*KV) * 2 // bytes saved per set of the seven
	proj := int64(N*max(Q, KV)) * 4           // the float32 staging of q, k and v
	logits := int64(N*cfg.VocabSize) * 2      // one chunk of the whole vocabulary
	for _, tc := range []struct {
		mode string
		sets int64 // sets of the seven: one per layer, or the scratch's
	}{{"none", int64(cfg.NLayers)}, {"full", 1}} {
		t.Run(tc.mode, func(t *testing.T) {
			var bytes [2]int64
			for i, p := range []backend.DType{backend.Float32, backend.BFloat16} {
				plan := Plan{Checkpoint: ActivationCheckpoint{Mode: tc.mode}, Precision: model.Precision{Param: p}}
				m, err := New(be, cfg, B, T, plan)
				if err != nil {
					t.Fatal(err)
				}
				want, err := ActivationBytesFor(cfg, B, T, plan)
				if err != nil {
					t.Fatal(err)
				}
				if got := m.ActivationBytes(); got != want {
					t.Errorf("%v: New allocated %d activation bytes, ActivationBytesFor planned %d", p, got, want)
				}
				bytes[i] = m.ActivationBytes()
				if want := map[bool]backend.DType{false: backend.Float32, true: backend.BFloat16}[p == backend.BFloat16]; m.logits.DType() != want || m.logits.Len != N*cfg.VocabSize {
					t.Errorf("%v: logits are %d %v, want %d %v", p, m.logits.Len, m.logits.DType(), N*cfg.VocabSize, want)
				}
				for l := range m.layers {
					a := &m.layers[l]
					if tc.mode == "full" && l > 0 {
						break // the layers share the scratch set
					}
					for _, f := range m.actFields(a) {
						want := backend.Float32
						if f.half && p == backend.BFloat16 {
							want = backend.BFloat16
						}
						if f.t.Mem == nil {
							continue // not held under this policy
						}
						if f.t.DType() != want {
							t.Errorf("%v: layer %d activation of %d elements is %v, want %v", p, l, f.n, f.t.DType(), want)
						}
					}
					for _, x := range []backend.Tensor{a.attnNorm, a.ffnNorm, a.hs, a.q, a.k, a.v, a.attn} {
						if p == backend.BFloat16 && x.DType() != backend.BFloat16 {
							t.Errorf("layer %d: a norm output, the SwiGLU product, q, k, v or the attention output is %v, want bfloat16", l, x.DType())
						}
					}
				}
			}
			if got := bytes[0] - bytes[1]; got != tc.sets*half-proj+logits {
				t.Errorf("bfloat16 activations %d bytes below float32's, want %d × %d - %d + %d", got, tc.sets, half, proj, logits)
			}
		})
	}
}

// TestBF16Logits: under bfloat16 mixed precision the logits are a
// bfloat16 buffer holding the rounding of the output layer's float32
// product (GemmBF16 of the final norm's output and the output weight,
// bit for bit, and the float64 product within a bfloat16 rounding),
// and the loss is the float64 cross-entropy of those rounded logits (as
// PyTorch's loss upcasts its bfloat16 input); so with a float8 output
// layer, whose unscaled product is rounded the same way. Chunking the
// logits (recomputed in the backward) changes the loss and the output
// weight's gradient by float32 rounding alone.
func TestBF16Logits(t *testing.T) {
	cfg := parallelTestConfig()
	const B, T = 2, 8
	N, D, V := B*T, cfg.Dim, cfg.VocabSize
	be := cpu.New(2)
	defer be.Close()
	r := rand.New(rand.NewPCG(21, 22))
	tokens, targets := make([]int32, N), make([]int32, N)
	for i := range tokens {
		tokens[i], targets[i] = int32(r.IntN(V)), int32(r.IntN(V))
	}
	targets[5] = -1
	for _, tc := range []struct {
		name string
		prec model.Precision
	}{
		{"bfloat16", model.Precision{Param: backend.BFloat16}},
		{"float8 output", f8prec(float8.Tensorwise, []string{"attention.wq"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(chunk int) (*Model, float32, []float32) {
				m, err := New(be, cfg, B, T, Plan{Precision: tc.prec, LogitChunk: chunk})
				if err != nil {
					t.Fatal(err)
				}
				m.Init(3)
				loss, err := m.Forward(tokens, targets)
				if err != nil {
					t.Fatal(err)
				}
				if m.logits.DType() != backend.BFloat16 {
					t.Fatalf("chunk %d: logits are %v", chunk, m.logits.DType())
				}
				var logits []float32
				if chunk == V {
					logits = make([]float32, N*V)
					if err := m.Logits(logits); err != nil {
						t.Fatal(err)
					}
				}
				m.ZeroGrad()
				if err := m.Backward(1 / float32(m.NumTargets())); err != nil {
					t.Fatal(err)
				}
				return m, loss, logits
			}
			m, loss, logits := run(V)
			// Against the float64 product of the operands as cast: within
			// float32 accumulation and one bfloat16 rounding.
			x, w := download(be, m.xfin), download(be, m.P.Output)
			xc, wc := refBF16(x), refBF16(w)
			if tc.prec.Float8 != nil {
				xc, wc = refCast(x, N, D, castSpec{}), refCast(w, V, D, castSpec{})
			}
			want, abs := refMatmul(N, V, D, func(i, p int) float64 { return xc[i*D+p] }, func(p, j int) float64 { return wc[j*D+p] })
			for i, v := range logits {
				if d := math.Abs(float64(v) - want[i]); d > 0x1p-8*math.Abs(want[i])+float64(D+4)*0x1p-23*abs[i] {
					t.Fatalf("logit %d = %v, want %v within a bfloat16 rounding", i, v, want[i])
				}
			}
			if tc.prec.Float8 == nil {
				y := be.Alloc(backend.Float32, N*V)
				be.GemmBF16(false, true, N, V, D, 1, m.xfin, D, m.P.Output, D, 0, y, V)
				for i, v := range download(be, y) {
					if w := numeric.RoundBF16(v); math.Float32bits(logits[i]) != math.Float32bits(w) {
						t.Fatalf("logit %d = %v, want %v (the rounding of %v)", i, logits[i], w, v)
					}
				}
			}
			var sum float64
			n := 0
			for i, tg := range targets {
				if tg < 0 {
					continue
				}
				row := logits[i*V : (i+1)*V]
				mx := math.Inf(-1)
				for _, x := range row {
					mx = math.Max(mx, float64(x))
				}
				var s float64
				for _, x := range row {
					s += math.Exp(float64(x) - mx)
				}
				sum += mx + math.Log(s) - float64(row[tg])
				n++
			}
			if want := sum / float64(n); math.Abs(float64(loss)-want) > 1e-6*want {
				t.Errorf("loss %v, want %v: the cross-entropy of the bfloat16 logits", loss, want)
			}
			if tc.prec.Float8 != nil {
				return // float8 needs the logits whole
			}
			mc, lossC, _ := run(17)
			if math.Abs(float64(lossC-loss)) > 1e-6*float64(loss) {
				t.Errorf("loss %v with chunks of 17 logits, %v whole", lossC, loss)
			}
			if l2, _ := relErr(download(be, mc.G.Output), download(be, m.G.Output)); l2 > 1e-3 {
				t.Errorf("output weight gradient with chunks of 17 logits %.3g (L2) from the whole logits'", l2)
			}
		})
	}
}

// TestHalfActivationsParallel: under tensor parallelism the attention
// output and q, k, v stay bfloat16 (the heads are local) while the norm
// outputs, gathered from float32 host buffers, are float32; under context
// parallelism too the attention output and q, k, v are bfloat16 (the
// ring's float32 host buffers hold k and v widened, and its merged
// output is rounded once). ActivationBytesFor plans what New allocates
// in both.
func TestHalfActivationsParallel(t *testing.T) {
	cfg := Config{Dim: 32, NLayers: 2, NHeads: 4, NKVHeads: 2, VocabSize: 64, MultipleOf: 16, NormEps: 1e-5, RoPETheta: 10000, MaxSeqLen: 16}
	be := cpu.New(1)
	defer be.Close()
	bf16 := model.Precision{Param: backend.BFloat16}
	for _, tc := range []struct {
		name       string
		plan       Plan
		norm, attn backend.DType
	}{
		{"TP2", Plan{TP: 2, Comm: nilComm{}, Precision: bf16}, backend.Float32, backend.BFloat16},
		{"CP2", Plan{CP: 2, Comm: nilComm{}, Precision: bf16}, backend.BFloat16, backend.BFloat16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(be, cfg, 2, 8, tc.plan)
			if err != nil {
				t.Fatal(err)
			}
			want, err := ActivationBytesFor(cfg, 2, 8, tc.plan)
			if err != nil {
				t.Fatal(err)
			}
			if got := m.ActivationBytes(); got != want {
				t.Errorf("New allocated %d activation bytes, ActivationBytesFor planned %d", got, want)
			}
			for l := range m.layers {
				a := &m.layers[l]
				for _, c := range []struct {
					name string
					x    backend.Tensor
					want backend.DType
				}{{"attention norm", a.attnNorm, tc.norm}, {"ffn norm", a.ffnNorm, tc.norm}, {"SwiGLU product", a.hs, backend.BFloat16},
					{"q", a.q, tc.attn}, {"k", a.k, tc.attn}, {"v", a.v, tc.attn}, {"attention output", a.attn, tc.attn}} {
					if got := c.x.DType(); got != c.want {
						t.Errorf("layer %d: %s is %v, want %v", l, c.name, got, c.want)
					}
				}
			}
		})
	}
}

// nilComm is a ParallelComm for models that are built and never run.
type nilComm struct{ ParallelComm }
