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
	// checkpoints layers 1, 3, 5, … — or "op", torchtitan's per-operation
	// policy applied to every layer: the attention's outputs (output and
	// log-sum-exp) and every other matrix product's output, counted in
	// the order the forward runs them (wq·x, wv·x, w1·x; w2's needs no
	// keeping, it is the next layer's input) are kept, and the rest is
	// recomputed before the layer's backward: the products wk·x (with
	// its RoPE), wo·attn (with the residual sum after it) and w3·x, both
	// RMSNorms and the SwiGLU product. RoPE is applied in place to the q
	// product, so keeping the rotated tensor costs the same memory and
	// RoPE, whose backward needs only its tables, is never recomputed
	// for q.
	SelectiveOption string
}

// layerPolicy is what one layer keeps for its backward pass.
type layerPolicy uint8

const (
	keepAll        layerPolicy = iota // every activation is kept
	recomputeLayer                    // only the input is kept; the layer is rerun
	recomputeOps                      // attention and every other product's outputs are kept
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
// size in floats and whether the per-operation policy (selective "op")
// recomputes it rather than keeping it.
type actField struct {
	t *backend.Tensor
	n int
	// byOps: recomputed under the per-operation policy.
	byOps bool
	// half: bfloat16 under mixed precision (read only by bfloat16
	// products, or attention's output; see Model.halfAct).
	half bool
}

// planActs lays out the activation sets layers (one per layer, policy
// giving each one's policy), as Model.carve describes: the views a layer
// keeps for its backward with keep, the one scratch set its recomputed
// views share with temp; fields lists the views of one set.
func planActs[A any](policy []layerPolicy, layers []A, fields func(*A) []actField, keep, temp func(n int, half bool) backend.Tensor) {
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
				if full || f.byOps {
					*f.t = temp(f.n, f.half)
				}
			}
			sharedDone = true
		}
		own := fields(&layers[l])
		for i, f := range fields(&shared) {
			if p == recomputeLayer || f.byOps {
				*own[i].t = *f.t
			}
		}
	}
	for l, p := range policy {
		for _, f := range fields(&layers[l]) {
			if p == keepAll || (p == recomputeOps && !f.byOps) {
				*f.t = keep(f.n, f.half)
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
