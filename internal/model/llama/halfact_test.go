package llama

import (
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/model"
)

// TestHalfActivations: under bfloat16 mixed precision the activations
// only bfloat16 products read — both norm outputs, the SwiGLU product and
// attention's q, k and v of every layer — and attention's output are
// bfloat16 tensors and every other one float32; the model's activation memory is the float32
// model's less two bytes per element of them (kept per layer without
// checkpointing, once in the recomputation scratch under full
// checkpointing) plus the float32 staging of the projections, and
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
			if got := bytes[0] - bytes[1]; got != tc.sets*half-proj {
				t.Errorf("bfloat16 activations %d bytes below float32's, want %d × %d - %d", got, tc.sets, half, proj)
			}
		})
	}
}

// TestHalfActivationsParallel: under tensor parallelism the attention
// output and q, k, v stay bfloat16 (the heads are local) while the norm
// outputs, gathered from float32 host buffers, are float32; under context
// parallelism the attention output and q, k, v are float32 (ring
// attention stages k, v and the merged output in float32 host buffers).
// ActivationBytesFor plans what New allocates in both.
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
		{"CP2", Plan{CP: 2, Comm: nilComm{}, Precision: bf16}, backend.BFloat16, backend.Float32},
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
