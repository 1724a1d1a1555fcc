package llama

import "github.com/titan-go/titan/internal/backend"

// Activation checkpointing of a Sharded model follows the plain model's
// design (see ActivationCheckpoint): every layer's input is kept and the
// recomputed activations of all layers share one scratch set. A layer's
// recomputation issues the same collectives as its forward (the sequence
// all-gathers and reduce-scatters, the ring attention's shifts); every
// rank of a tp and cp group has the same policy and recomputes the same
// layers at the same point of its backward, so the collectives match.

// shardActFields lists the views of a shardActs (see actField).
func (m *Sharded) shardActFields(a *shardActs) []actField {
	N, n, D := m.N, m.n, m.Cfg.Dim
	return []actField{
		{&a.attnNorm, N * D, true}, {&a.attnRstd, n, true},
		{&a.q, N * m.nq, false}, {&a.k, N * m.nkvd, false}, {&a.v, N * m.nkvd, false},
		{&a.attn, N * m.nq, false}, {&a.lse, N * m.nh, false},
		{&a.mid, n * D, false},
		{&a.ffnNorm, N * D, true}, {&a.ffnRstd, n, true},
		{&a.h1, N * m.f, false}, {&a.h3, N * m.f, false}, {&a.hs, N * m.f, true},
	}
}

// planLayers allocates the layer activations by m.policy and returns
// their size in floats.
func (m *Sharded) planLayers() int {
	total := 0
	next := func(k int) backend.Tensor {
		total += k
		return m.be.Alloc(backend.Float32, k)
	}
	m.layers = make([]shardActs, m.Cfg.NLayers)
	planActs(m.policy, m.layers, m.shardActFields, next)
	return total
}

// layerForward runs layer l's forward from m.resid[l] into its
// activations and, when out is set, its output m.resid[l+1]. The backward
// pass's recomputation leaves out unset: the output is kept anyway. It
// uses m.seq and m.full as scratch.
func (m *Sharded) layerForward(l int, out bool) error {
	be := m.be
	N, n, D := m.N, m.n, m.Cfg.Dim
	eps := float32(m.Cfg.NormEps)
	a, p := &m.layers[l], &m.P.Layers[l]
	be.RMSNormForward(m.seq, a.attnRstd, m.resid[l], p.AttnNorm, n, D, eps)
	if err := m.gather(a.attnNorm, m.seq); err != nil {
		return err
	}
	linear(be, a.q, a.attnNorm, p.Wq, N, D, m.nq, false)
	linear(be, a.k, a.attnNorm, p.Wk, N, D, m.nkvd, false)
	linear(be, a.v, a.attnNorm, p.Wv, N, D, m.nkvd, false)
	m.rope(backend.Tensor{}, a.q, m.nh, false)
	m.rope(backend.Tensor{}, a.k, m.nkv, false)
	if err := m.attention(a); err != nil {
		return err
	}
	linear(be, m.full, a.attn, p.Wo, N, m.nq, D, false)
	if err := m.scatter(m.seq, m.full, false); err != nil {
		return err
	}
	be.Add(a.mid, m.resid[l], m.seq)
	be.RMSNormForward(m.seq, a.ffnRstd, a.mid, p.FFNNorm, n, D, eps)
	if err := m.gather(a.ffnNorm, m.seq); err != nil {
		return err
	}
	linear(be, a.h1, a.ffnNorm, p.W1, N, D, m.f, false)
	linear(be, a.h3, a.ffnNorm, p.W3, N, D, m.f, false)
	be.SwiGLUForward(a.hs, a.h1, a.h3, N*m.f)
	if !out {
		return nil
	}
	linear(be, m.full, a.hs, p.W2, N, m.f, D, false)
	if err := m.scatter(m.seq, m.full, false); err != nil {
		return err
	}
	be.Add(m.resid[l+1], a.mid, m.seq)
	return nil
}

// recomputeCheap recomputes layer l's element-wise activations (both
// RMSNorms, with their sequence all-gathers, and the SwiGLU product) from
// its kept ones, exactly as layerForward computed them.
func (m *Sharded) recomputeCheap(l int) error {
	be := m.be
	n, D := m.n, m.Cfg.Dim
	eps := float32(m.Cfg.NormEps)
	a, p := &m.layers[l], &m.P.Layers[l]
	be.RMSNormForward(m.seq, a.attnRstd, m.resid[l], p.AttnNorm, n, D, eps)
	if err := m.gather(a.attnNorm, m.seq); err != nil {
		return err
	}
	be.RMSNormForward(m.seq, a.ffnRstd, a.mid, p.FFNNorm, n, D, eps)
	if err := m.gather(a.ffnNorm, m.seq); err != nil {
		return err
	}
	be.SwiGLUForward(a.hs, a.h1, a.h3, m.N*m.f)
	return nil
}

// restore makes layer l's activations available to its backward pass,
// recomputing them into the shared scratch set unless they are kept or
// still there (the last checkpointed layer of the forward pass is not
// recomputed: nothing overwrote its activations). Every rank of the
// groups decides alike, so all of them recompute, or none.
func (m *Sharded) restore(l int) error {
	p := m.policy[l]
	if p == keepAll || m.scratchLayer == l {
		return nil
	}
	m.scratchLayer = -1
	var err error
	if p == recomputeLayer {
		err = m.layerForward(l, false)
	} else {
		err = m.recomputeCheap(l)
	}
	if err != nil {
		return err
	}
	m.recomputed++
	m.scratchLayer = l
	return nil
}
