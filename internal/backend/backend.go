// Package backend defines the compute interface every device implements.
//
// Model code holds Tensors (typed views into device memory) and calls
// Backend operations; it never touches host pointers. The CPU backend lives
// in backend/cpu; a CUDA backend implements the same interface.
//
// Conventions, in the spirit of llm.c:
//   - Tensors carry no shape. Every operation takes its dimensions
//     explicitly; matrices are row-major.
//   - Forward operations overwrite their outputs.
//   - Backward operations ACCUMULATE (+=) into every gradient they write,
//     both parameter gradients and input (activation) gradients. Callers
//     zero gradient buffers before a backward pass.
package backend

import "fmt"

// DType is the element type of a tensor. It is a property of the memory,
// so that bfloat16 buffers can sit beside float32 ones.
type DType uint8

// Supported element types.
const (
	Float32 DType = iota
	BFloat16
	Int32
)

// Size is the number of bytes one element occupies.
func (d DType) Size() int {
	switch d {
	case Float32, Int32:
		return 4
	case BFloat16:
		return 2
	}
	panic(fmt.Sprintf("backend: unknown dtype %d", d))
}

func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case BFloat16:
		return "bfloat16"
	case Int32:
		return "int32"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Memory is one allocation owned by a backend.
type Memory struct {
	DType DType
	Len   int // elements
	// Host holds the elements of host-resident memory ([]float32, []uint16
	// for bfloat16, []int32). Device backends leave it nil and use Addr.
	Host any
	// Addr is the device address of element 0 for device memory.
	Addr uintptr
}

// Tensor is a view of Len elements of Mem starting at element Off.
// The zero Tensor is empty.
type Tensor struct {
	Mem *Memory
	Off int
	Len int
}

// DType returns the element type of the underlying memory.
func (t Tensor) DType() DType { return t.Mem.DType }

// HostFloat32 returns t's elements when they are float32 host memory, so
// that host-side code (collectives, optimizers) can work on them in
// place; ok is false for device memory, which must be staged with
// Download and Upload instead.
func (t Tensor) HostFloat32() (h []float32, ok bool) {
	if t.Mem == nil {
		return nil, t.Len == 0
	}
	all, ok := t.Mem.Host.([]float32)
	if !ok {
		return nil, false
	}
	return all[t.Off : t.Off+t.Len], true
}

// HostBF16 is HostFloat32 for bfloat16 host memory (the bit patterns).
func (t Tensor) HostBF16() (h []uint16, ok bool) {
	if t.Mem == nil {
		return nil, t.Len == 0
	}
	all, ok := t.Mem.Host.([]uint16)
	if !ok {
		return nil, false
	}
	return all[t.Off : t.Off+t.Len], true
}

// Slice returns the view of n elements starting at element off of t.
func (t Tensor) Slice(off, n int) Tensor {
	if off < 0 || n < 0 || off+n > t.Len {
		panic(fmt.Sprintf("backend: slice [%d:%d] out of range for tensor of %d elements", off, off+n, t.Len))
	}
	return Tensor{Mem: t.Mem, Off: t.Off + off, Len: n}
}

// AttentionDims describes one causal grouped-query attention call.
//
// Queries are laid out [B, Tq, NH, HD] and keys/values [B, Tk, NKV, HD]
// (the natural outputs of the q/k/v projections). Query i sits at absolute
// position QPos+i and key j at KPos+j; a query attends to the keys whose
// position is not greater than its own. NH must be a multiple of NKV:
// query head h reads key/value head h/(NH/NKV).
//
// A plain training step has Tq == Tk and QPos == KPos == 0. Generation with
// a KV cache uses Tq == 1, QPos == KPos+Tk-1. Ring attention (context
// parallel) calls it per key/value chunk with the chunks' offsets.
type AttentionDims struct {
	B, Tq, Tk   int
	NH, NKV, HD int
	QPos, KPos  int
	// BF16 multiplies the products Q·Kᵀ, P·V and those of the backward
	// pass as bfloat16 with float32 accumulation (bfloat16 mixed
	// precision, as autocast's attention); the softmax and its statistics
	// stay float32, as do the gradients.
	BF16 bool
}

// Backend owns device memory and implements the operations the model
// families need (Llama-style transformers, Hyena). Float tensors are
// float32 unless stated otherwise; token tensors are Int32.
type Backend interface {
	// Name identifies the backend ("cpu", "cuda").
	Name() string

	// Alloc returns n zeroed elements of the given type.
	Alloc(dtype DType, n int) Tensor
	// Upload copies host data ([]float32, []int32 or bfloat16 bit
	// patterns []uint16 matching dst's dtype) into dst; a []float32 into
	// a bfloat16 dst is rounded to nearest even (as Copy).
	Upload(dst Tensor, src any)
	// Download copies src into host data ([]float32, []int32 or
	// []uint16 matching src's dtype); a bfloat16 src into a []float32 is
	// widened exactly.
	Download(dst any, src Tensor)
	// Zero sets every element of t to zero.
	Zero(t Tensor)
	// Copy copies src into dst (same length and dtype; or a float32 src
	// into a bfloat16 dst, each element rounded to nearest even).
	Copy(dst, src Tensor)
	// Sync waits for all queued work (a no-op on the CPU).
	Sync()

	// Gemm computes C = alpha*op(A)*op(B) + beta*C, row-major, where op(A)
	// is m×k and op(B) is k×n; op transposes when transA/transB is set.
	// When A or B is BFloat16 (the other may be Float32), the products are
	// of bfloat16 values (a Float32 operand rounded to nearest even) and
	// accumulate in float32; C is Float32 in every case.
	Gemm(transA, transB bool, m, n, k int, alpha float32, a Tensor, lda int, b Tensor, ldb int, beta float32, c Tensor, ldc int)
	// GemmBF16 is Gemm with both operands multiplied as bfloat16 whatever
	// their dtype (Float32 ones rounded to nearest even, as Gemm rounds a
	// Float32 operand beside a BFloat16 one) and float32 accumulation into
	// the Float32 C: the matrix products of bfloat16 mixed precision, and
	// the exact products of float8 values (every e4m3 and e5m2 value is a
	// bfloat16). C may also be BFloat16 (the output layer's logits under
	// mixed precision): the products accumulate in float32 over all of K
	// (from C widened when beta != 0) and are rounded to nearest even once,
	// the rounding of the Float32 C's result.
	GemmBF16(transA, transB bool, m, n, k int, alpha float32, a Tensor, lda int, b Tensor, ldb int, beta float32, c Tensor, ldc int)
	// GemmStridedBatched runs batch independent Gemms; matrix i of A, B, C
	// starts strideA*i, strideB*i, strideC*i elements into a, b, c.
	GemmStridedBatched(transA, transB bool, m, n, k int, alpha float32, a Tensor, lda, strideA int, b Tensor, ldb, strideB int, beta float32, c Tensor, ldc, strideC int, batch int)

	// EmbeddingForward gathers rows: out[i,:] = table[tokens[i],:] for N tokens of width C.
	EmbeddingForward(out, table, tokens Tensor, N, C int)
	// EmbeddingBackward scatters: dtable[tokens[i],:] += dout[i,:].
	EmbeddingBackward(dtable, dout, tokens Tensor, N, C int)

	// RMSNormForward computes out = inp * rstd * weight per row, with
	// rstd[i] = 1/sqrt(mean(inp[i,:]^2) + eps) saved for the backward.
	// out is float32, or bfloat16 (each output rounded to nearest even)
	// where only bfloat16 products read it (mixed precision).
	RMSNormForward(out, rstd, inp, weight Tensor, N, C int, eps float32)
	// RMSNormBackward accumulates dinp and dweight.
	RMSNormBackward(dinp, dweight, dout, inp, weight, rstd Tensor, N, C int)

	// RoPEForward rotates consecutive pairs (x[2i], x[2i+1]) of each head of
	// inp [B, T, NH, HD] by the angle whose cos/sin are freqs[t, i] (tables
	// [T, HD/2]); out may alias inp. out is float32, or bfloat16 as
	// RMSNormForward's.
	RoPEForward(out, inp, cos, sin Tensor, B, T, NH, HD int)
	// RoPEBackward accumulates the inverse rotation of dout into dinp.
	RoPEBackward(dinp, dout, cos, sin Tensor, B, T, NH, HD int)

	// AttentionForward computes causal softmax(q k^T / sqrt(HD)) v without
	// materialising the Tq×Tk matrix. out is [B, Tq, NH, HD]; lse
	// [B, NH, Tq] receives each row's log-sum-exp for the backward. With
	// d.BF16, q, k and v may be bfloat16 (they are read only by the
	// products), in the forward and in AttentionBackward. out is float32,
	// or bfloat16 as RMSNormForward's (autocast's attention output: the
	// float32 result rounded once).
	AttentionForward(out, lse, q, k, v Tensor, d AttentionDims)
	// AttentionBackward accumulates dq, dk, dv (float32) from dout,
	// recomputing the probabilities from q, k, lse; out, the forward's
	// (float32 or bfloat16), gives rowsum(dout·out).
	AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse Tensor, d AttentionDims)

	// SwiGLUForward computes out = silu(gate) * up over n elements; out
	// is float32 or bfloat16, as RMSNormForward's.
	SwiGLUForward(out, gate, up Tensor, n int)
	// SwiGLUBackward accumulates dgate and dup.
	SwiGLUBackward(dgate, dup, dout, gate, up Tensor, n int)

	// CrossEntropyChunk folds a vocabulary chunk of logits [N, V] (columns
	// vOff..vOff+V of the full vocabulary) into the running per-row state
	// stats [N, 3] = (max, sum of exp(x-max), target logit). stats must be
	// reset with CrossEntropyReset before the first chunk. Targets < 0 are
	// ignored rows. logits are Float32 or BFloat16 (widened exactly: the
	// statistics accumulate in float32 as for their Float32 values).
	CrossEntropyChunk(stats, logits, targets Tensor, N, V, vOff int)
	// CrossEntropyReset prepares stats [N, 3] for a new pass.
	CrossEntropyReset(stats Tensor, N int)
	// CrossEntropyLoss writes losses[i] = logsumexp - target logit (0 for
	// ignored rows) from completed stats.
	CrossEntropyLoss(losses, stats, targets Tensor, N int)
	// CrossEntropyChunkBackward overwrites logits [N, V] (chunk at vOff)
	// with dloss/dlogits = scale * (softmax - onehot(target)), using the
	// completed stats. Ignored rows get zero. BFloat16 logits get the
	// nearest-even rounding of the gradient of their Float32 values.
	CrossEntropyChunkBackward(logits, stats, targets Tensor, N, V, vOff int, scale float32)

	// LayerNormForward computes out = (inp - mean) * rstd * weight + bias
	// per row of C elements, saving each row's mean and rstd =
	// 1/sqrt(var + eps) (biased variance) [N] for the backward.
	LayerNormForward(out, mean, rstd, inp, weight, bias Tensor, N, C int, eps float32)
	// LayerNormBackward accumulates dinp, dweight and dbias.
	LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd Tensor, N, C int)

	// GELUTanhForward computes out = gelu(inp) over n elements with the
	// tanh approximation 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³)))
	// (PyTorch's approximate="tanh"); out may alias inp.
	GELUTanhForward(out, inp Tensor, n int)
	// GELUTanhBackward accumulates dinp += dout · gelu'(inp).
	GELUTanhBackward(dinp, dout, inp Tensor, n int)

	// BroadcastRows sets every row of out [N, C] to row [C] (a linear
	// layer's bias, onto which a Gemm with beta 1 then accumulates the
	// product).
	BroadcastRows(out, row Tensor, N, C int)
	// SumRows accumulates dst[j] += Σ_i src[i, j] over the N rows of src
	// [N, C] (a bias gradient).
	SumRows(dst, src Tensor, N, C int)

	// Transpose writes out[b, c, r] = inp[b, r, c] for B matrices of R×C
	// elements (token-major [B, T, C] to channel-major [B, C, T] and back).
	// out must not alias inp.
	Transpose(out, inp Tensor, B, R, C int)

	// Mul computes out = a ⊙ b elementwise; out may alias a or b.
	Mul(out, a, b Tensor)
	// MulBackward accumulates da += dout ⊙ b and db += dout ⊙ a; a
	// gradient with nil Mem is not computed.
	MulBackward(da, db, dout, a, b Tensor)

	// ChannelScaleAdd computes out[b, c, l] = a[b, c, l] + w[c]·x[b, c, l]
	// over channel-major [B, C, L] buffers (a per-channel skip term added
	// to a convolution's output); out may alias a.
	ChannelScaleAdd(out, a, x, w Tensor, B, C, L int)
	// ChannelScaleAddBackward accumulates dx += w[c]·dout and
	// dw[c] += Σ_{b,l} dout·x; the gradient of a is dout itself.
	ChannelScaleAddBackward(dx, dw, dout, x, w Tensor, B, C, L int)

	// ShortConvForward is a causal depthwise convolution of width K over
	// channel-major [B, C, L] buffers: out[b, c, t] = bias[c] +
	// Σ_{k<K} weight[c, k]·inp[b, c, t-K+1+k], inputs before t = 0 being
	// zero (PyTorch's Conv1d with groups = C and padding K-1, cut to the
	// first L outputs: weight[c, K-1] multiplies the current input).
	ShortConvForward(out, inp, weight, bias Tensor, B, C, L, K int)
	// ShortConvBackward accumulates dinp, dweight [C, K] and dbias [C].
	ShortConvBackward(dinp, dweight, dbias, dout, inp, weight Tensor, B, C, L, K int)
	// ShortConvStep advances the convolution by one position for B
	// sequences: state [B, C, K-1] holds each channel's last K-1 inputs,
	// oldest first; inp [B, C] is the new input. It writes out [B, C] =
	// bias + Σ_{k<K-1} weight[c, k]·state[b, c, k] + weight[c, K-1]·inp
	// and shifts inp into state.
	ShortConvStep(out, state, inp, weight, bias Tensor, B, C, K int)

	// SinForward computes out[i, j] = sin(freq[j]·inp[i, j]) for N rows of
	// C elements (a periodic activation with a trainable frequency per
	// column); out may alias inp.
	SinForward(out, inp, freq Tensor, N, C int)
	// SinBackward accumulates dinp += dout·freq·cos(freq·inp) and
	// dfreq[j] += Σ_i dout·inp·cos(freq·inp).
	SinBackward(dinp, dfreq, dout, inp, freq Tensor, N, C int)

	// AdamW updates params in place (PyTorch's AdamW, decoupled weight
	// decay, bias correction for the 1-based step t). Gradients are
	// multiplied by gradScale first (gradient clipping).
	AdamW(params, grads, m, v Tensor, lr, beta1, beta2, eps, weightDecay, gradScale float32, t int)
	// SumSquares returns the sum of x[i]^2 accumulated in float64.
	SumSquares(x Tensor) float64

	// Add computes out = a + b elementwise; out may alias a or b.
	Add(out, a, b Tensor)
	// Axpy computes y += alpha*x.
	Axpy(y Tensor, alpha float32, x Tensor)
	// Scale computes x *= alpha.
	Scale(x Tensor, alpha float32)
}
