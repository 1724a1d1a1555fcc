package hyena

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
)

// This file exposes what a generator needs from a parallel forward pass
// over a prompt to continue it one position at a time with a Stepper:
// every long convolution's inputs (to prefill an online convolution) and
// the short convolutions' states at the end of the prompt.

// ConvInput is the o-th long convolution's input of local layer l in the
// last Forward, [B, D, T] channel-major (each row's channel is
// contiguous, the layout of longconv.Online.Prefill), for o < Order-1.
// Backward reads it: a caller may overwrite it only when no Backward of
// that Forward follows.
func (m *Model) ConvInput(l, o int) backend.Tensor {
	return m.layers[l].s[o]
}

// StepState sets st, a Stepper state for the Model's B sequences, to the
// short-convolution state of local layer l after the T positions of the
// last Forward (the last K-1 in_proj outputs of every channel, zeros
// before position 0), so that the Stepper continues the sequences at
// position T. st.Conv must have (Order+1)·B·D·(K-1) elements
// (Stepper.NewState).
func (m *Model) StepState(l int, st *LayerState) error {
	c, be := m.Cfg, m.be
	B, T, D, K, n := m.B, m.T, c.DModel, c.ShortFilterOrder, c.Order
	if l < 0 || l >= m.nl {
		return fmt.Errorf("hyena: StepState of layer %d (the model has %d)", l, m.nl)
	}
	if want := (n + 1) * B * D * (K - 1); st.Conv.Len != want {
		return fmt.Errorf("hyena: StepState: state has %d elements, want %d", st.Conv.Len, want)
	}
	if K == 1 {
		return nil
	}
	be.Zero(st.Conv)
	keep := min(K-1, T)  // positions of the prompt the state holds
	zT := m.layers[l].zT // [B, (Order+1)·D, T]
	for i := 0; i <= n; i++ {
		for b := 0; b < B; b++ {
			for d := 0; d < D; d++ {
				src := zT.Slice(((b*(n+1)+i)*D+d)*T+T-keep, keep)
				dst := st.Conv.Slice(((i*B+b)*D+d)*(K-1)+K-1-keep, keep)
				be.Copy(dst, src)
			}
		}
	}
	return nil
}

// LastHidden copies each sequence's output of the last layer at its
// last position (T-1) in the last Forward into a [B, D]: the input of
// Stepper.Logits for the next token. The Model must hold the last layer.
func (m *Model) LastHidden(a backend.Tensor) error {
	if m.Spec.FirstLayer+m.nl != m.Cfg.NLayer {
		return fmt.Errorf("hyena: LastHidden on a stage without the last layer")
	}
	D, T := m.Cfg.DModel, m.T
	out := m.resid[m.nl]
	for b := 0; b < m.B; b++ {
		m.be.Copy(a.Slice(b*D, D), out.Slice((b*T+T-1)*D, D))
	}
	return nil
}
