package llama

import (
	"fmt"
	"strconv"

	"github.com/titan-go/titan/internal/backend"
)

// ActivationCheckpoint selects which layer activations the forward pass
// keeps for the backward pass and which the backward pass recomputes, as
// torchtitan's [activation_checkpoint] section does. The zero value keeps
// everything.
//
// Every layer's input (the residual stream entering it) is always kept.
// The recomputed activations of all layers share one scratch set, which
// is where the memory is saved. Recomputation runs the same kernels on
// the same inputs, so losses and gradients are bitwise those of Mode
// "none".
type ActivationCheckpoint struct {
	// Mode is "none" (or ""): keep every activation; "full": keep only
	// each layer's input and recompute the whole layer's forward just
	// before its backward; or "selective", per SelectiveOption.
	Mode string
	// SelectiveOption, for Mode "selective", is either a positive integer
	// N as a decimal string, to checkpoint (recompute fully) every N-th
	// layer and keep the others — layer l (from 0) is checkpointed when
	// (l+1) % N == 0, torchtitan's counter rule, so "1" is "full" and "2"
	// checkpoints layers 1, 3, 5, … — or "op", a per-operation policy
	// applied to every layer: the outputs of the matrix products (q, k,
	// v, the attention's residual sum, w1·x and w3·x) and of the attention
	// (output and log-sum-exp) are kept, and the cheap element-wise
	// operations (both RMSNorms and the SwiGLU product) are recomputed.
	// RoPE is applied in place to the q and k products, so keeping the
	// rotated tensors costs the same memory and RoPE, whose backward needs
	// only its tables, is never recomputed.
	SelectiveOption string
}

// layerPolicy is what one layer keeps for its backward pass.
type layerPolicy uint8

const (
	keepAll        layerPolicy = iota // every activation is kept
	recomputeLayer                    // only the input is kept; the layer is rerun
	recomputeOps                      // matmul and attention outputs are kept
)

// policies returns the policy of each of n layers.
func (ac ActivationCheckpoint) policies(n int) ([]layerPolicy, error) {
	ps := make([]layerPolicy, n)
	fill := func(p layerPolicy, every int) {
		for l := range ps {
			if (l+1)%every == 0 {
				ps[l] = p
			}
		}
	}
	switch ac.Mode {
	case "", "none":
	case "full":
		fill(recomputeLayer, 1)
	case "selective":
		if ac.SelectiveOption == "op" {
			fill(recomputeOps, 1)
			break
		}
		every, err := strconv.Atoi(ac.SelectiveOption)
		if err != nil || every < 1 {
			return nil, fmt.Errorf("llama: activation checkpointing option %q: want \"op\" or a positive integer", ac.SelectiveOption)
		}
		fill(recomputeLayer, every)
	default:
		return nil, fmt.Errorf("llama: activation checkpointing mode %q: want none, full or selective", ac.Mode)
	}
	return ps, nil
}

// String describes the policy as the recipe spells it.
func (ac ActivationCheckpoint) String() string {
	switch ac.Mode {
	case "", "none":
		return "none"
	case "selective":
		return "selective " + ac.SelectiveOption
	}
	return ac.Mode
}

// actField is one view of a layer's activation set: where it goes, its
// size in floats and whether it is cheap to recompute (selective "op"
// keeps only the others).
type actField struct {
	t     *backend.Tensor
	n     int
	cheap bool
}

// actFields lists the views of a layerActs.
func actFields(a *layerActs, cfg Config, B, T int) []actField {
	BT, D, F := B*T, cfg.Dim, cfg.FFNHidden()
	Q, KV := cfg.NHeads*cfg.HeadDim(), cfg.KVHeads()*cfg.HeadDim()
	return []actField{
		{&a.attnNorm, BT * D, true}, {&a.attnRstd, BT, true},
		{&a.q, BT * Q, false}, {&a.k, BT * KV, false}, {&a.v, BT * KV, false},
		{&a.attn, BT * Q, false}, {&a.lse, B * cfg.NHeads * T, false},
		{&a.mid, BT * D, false},
		{&a.ffnNorm, BT * D, true}, {&a.ffnRstd, BT, true},
		{&a.h1, BT * F, false}, {&a.h3, BT * F, false}, {&a.hs, BT * F, true},
	}
}

// planLayers lays the layer activations out with next: a layer that keeps
// everything owns all its views; recomputed views of every other layer
// come from one shared scratch set, carved once.
func (m *Model) planLayers(next func(n int) backend.Tensor) {
	m.layers = make([]layerActs, m.Cfg.NLayers)
	planActs(m.policy, m.layers, func(a *layerActs) []actField { return actFields(a, m.Cfg, m.B, m.T) }, next)
}

// planActs lays out the activation sets layers (one per layer, policy
// giving each one's policy) with next, as Model.planLayers describes;
// fields lists the views of one set.
func planActs[A any](policy []layerPolicy, layers []A, fields func(*A) []actField, next func(n int) backend.Tensor) {
	var shared A
	sharedDone := false
	full := hasPolicy(policy, recomputeLayer)
	for l, p := range policy {
		if p == keepAll {
			continue
		}
		if !sharedDone {
			// The scratch set holds whatever any policy recomputes.
			for _, f := range fields(&shared) {
				if full || f.cheap {
					*f.t = next(f.n)
				}
			}
			sharedDone = true
		}
		own := fields(&layers[l])
		for i, f := range fields(&shared) {
			if p == recomputeLayer || f.cheap {
				*own[i].t = *f.t
			}
		}
	}
	for l, p := range policy {
		for _, f := range fields(&layers[l]) {
			if p == keepAll || (p == recomputeOps && !f.cheap) {
				*f.t = next(f.n)
			}
		}
	}
}

// hasPolicy reports whether some layer of policy has policy p.
func hasPolicy(policy []layerPolicy, p layerPolicy) bool {
	for _, q := range policy {
		if q == p {
			return true
		}
	}
	return false
}

// layerForward runs layer l's forward from m.resid[l] into its
// activations and, when out is set, its output m.resid[l+1]. The backward
// pass's recomputation leaves out unset: the output is kept anyway.
func (m *Model) layerForward(l int, out bool) {
	cfg, be := m.Cfg, m.be
	B, T := m.B, m.T
	BT, D, F := B*T, cfg.Dim, cfg.FFNHidden()
	H, KVH, HD := cfg.NHeads, cfg.KVHeads(), cfg.HeadDim()
	Q, KV := H*HD, KVH*HD
	eps := float32(cfg.NormEps)
	dims := backend.AttentionDims{B: B, Tq: T, Tk: T, NH: H, NKV: KVH, HD: HD}
	a, p := &m.layers[l], &m.P.Layers[l]
	x := m.resid[l]
	be.RMSNormForward(a.attnNorm, a.attnRstd, x, p.AttnNorm, BT, D, eps)
	linear(be, a.q, a.attnNorm, p.Wq, BT, D, Q, false)
	linear(be, a.k, a.attnNorm, p.Wk, BT, D, KV, false)
	linear(be, a.v, a.attnNorm, p.Wv, BT, D, KV, false)
	be.RoPEForward(a.q, a.q, m.cos, m.sin, B, T, H, HD)
	be.RoPEForward(a.k, a.k, m.cos, m.sin, B, T, KVH, HD)
	be.AttentionForward(a.attn, a.lse, a.q, a.k, a.v, dims)
	be.Copy(a.mid, x)
	linear(be, a.mid, a.attn, p.Wo, BT, Q, D, true)

	be.RMSNormForward(a.ffnNorm, a.ffnRstd, a.mid, p.FFNNorm, BT, D, eps)
	linear(be, a.h1, a.ffnNorm, p.W1, BT, D, F, false)
	linear(be, a.h3, a.ffnNorm, p.W3, BT, D, F, false)
	be.SwiGLUForward(a.hs, a.h1, a.h3, BT*F)
	if out {
		be.Copy(m.resid[l+1], a.mid)
		linear(be, m.resid[l+1], a.hs, p.W2, BT, F, D, true)
	}
}

// recomputeCheap recomputes layer l's element-wise activations (both
// RMSNorms and the SwiGLU product) from its kept ones, exactly as
// layerForward computed them.
func (m *Model) recomputeCheap(l int) {
	cfg, be := m.Cfg, m.be
	BT, D, F := m.B*m.T, cfg.Dim, cfg.FFNHidden()
	eps := float32(cfg.NormEps)
	a, p := &m.layers[l], &m.P.Layers[l]
	be.RMSNormForward(a.attnNorm, a.attnRstd, m.resid[l], p.AttnNorm, BT, D, eps)
	be.RMSNormForward(a.ffnNorm, a.ffnRstd, a.mid, p.FFNNorm, BT, D, eps)
	be.SwiGLUForward(a.hs, a.h1, a.h3, BT*F)
}

// restore makes layer l's activations available to its backward pass,
// recomputing them into the shared scratch set unless they are kept or
// still there (the last checkpointed layer of the forward pass is not
// recomputed: nothing overwrote its activations).
func (m *Model) restore(l int) {
	p := m.policy[l]
	if p == keepAll || m.scratchLayer == l {
		return
	}
	m.scratchLayer = -1
	if p == recomputeLayer {
		m.layerForward(l, false)
	} else {
		m.recomputeCheap(l)
	}
	m.recomputed++
	m.scratchLayer = l
}
