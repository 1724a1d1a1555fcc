package model

import (
	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/float8"
)

// Precision is how a part computes (training.mixed_precision_param and
// model.converters). Its zero value is float32 throughout.
type Precision struct {
	// Param is the dtype parameters are computed in: backend.Float32, or
	// backend.BFloat16 for mixed precision. With BFloat16 the engine binds
	// the bfloat16 rounding of every float32 master parameter (norm
	// weights and the embedding included, as FSDP's param_dtype casts
	// every parameter) and every linear layer multiplies its input and
	// weight as bfloat16 with float32 accumulation (as autocast rounds a
	// matmul's operands), and so do attention's products (Q·Kᵀ, P·V and
	// those of its backward: the probabilities are rounded to bfloat16
	// before P·V, as a bfloat16 attention kernel does). The activations
	// only those products read — the norms' outputs, SwiGLU's and
	// attention's q, k and v — are stored in bfloat16 (the same bits the
	// products would round them to), and so is attention's output
	// (autocast's attention returns bfloat16: its float32 result rounded
	// once, which the backward reads for rowsum(dO·O); under context
	// parallelism the ring's merged float32 result), and so are the output layer's
	// logits, rounded once from its float32 accumulation, and their
	// gradient (PyTorch's bfloat16 logits: the loss widens them and
	// accumulates in float32); everything else — the residual stream,
	// RoPE's and the norms' and SwiGLU's arithmetic, the softmax and its
	// statistics, the loss, the other gradients and the optimizer — stays
	// float32, in float32 buffers.
	Param backend.DType
	// Float8 converts linear layers to float8 (nil: none).
	Float8 *float8.Config
}

// BF16 reports whether parameters compute in bfloat16.
func (p Precision) BF16() bool { return p.Param == backend.BFloat16 }
