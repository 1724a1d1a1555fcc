// Package optim holds the optimizer and gradient clipping over flat
// parameter and gradient buffers.
package optim

import (
	"fmt"
	"math"

	"github.com/titan-go/titan/internal/backend"
)

// AdamWConfig are torch.optim.AdamW's hyperparameters.
type AdamWConfig struct {
	LR, Beta1, Beta2, Eps, WeightDecay float32
}

// AdamW is PyTorch's AdamW over one flat parameter buffer (or a shard of
// one). Its state is the first and second moments and the step count.
type AdamW struct {
	Cfg  AdamWConfig
	M, V backend.Tensor
	Step int
	be   backend.Backend
}

// NewAdamW allocates zeroed moments for n parameters.
func NewAdamW(be backend.Backend, n int, cfg AdamWConfig) *AdamW {
	return &AdamW{Cfg: cfg, M: be.Alloc(backend.Float32, n), V: be.Alloc(backend.Float32, n), be: be}
}

// Update applies one step at learning rate lr to params with grads
// multiplied by gradScale.
func (o *AdamW) Update(params, grads backend.Tensor, lr, gradScale float32) error {
	if params.Len != o.M.Len || grads.Len != o.M.Len {
		return fmt.Errorf("adamw: state holds %d parameters, got %d parameters and %d gradients", o.M.Len, params.Len, grads.Len)
	}
	o.Step++
	c := o.Cfg
	o.be.AdamW(params, grads, o.M, o.V, lr, c.Beta1, c.Beta2, c.Eps, c.WeightDecay, gradScale, o.Step)
	return nil
}

// ClipScale returns the global L2 norm of the gradients given their sum
// of squares (summed over every shard), and the factor that brings it down
// to maxNorm as torch.nn.utils.clip_grad_norm_ does (1 when the norm is
// already within maxNorm or maxNorm <= 0).
func ClipScale(sumSquares float64, maxNorm float32) (norm float64, scale float32) {
	norm = math.Sqrt(sumSquares)
	if maxNorm <= 0 {
		return norm, 1
	}
	coef := float32(maxNorm) / (float32(norm) + 1e-6)
	if coef > 1 {
		coef = 1
	}
	return norm, coef
}
