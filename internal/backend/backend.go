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
}

// Backend owns device memory and implements the operations Llama-style
// models need. Float tensors are float32 unless stated otherwise; token
// tensors are Int32.
type Backend interface {
	// Name identifies the backend ("cpu", "cuda").
	Name() string

	// Alloc returns n zeroed elements of the given type.
	Alloc(dtype DType, n int) Tensor
	// Upload copies host data ([]float32 or []int32 matching dst's dtype) into dst.
	Upload(dst Tensor, src any)
	// Download copies src into host data ([]float32 or []int32).
	Download(dst any, src Tensor)
	// Zero sets every element of t to zero.
	Zero(t Tensor)
	// Copy copies src into dst (same length and dtype).
	Copy(dst, src Tensor)
	// Sync waits for all queued work (a no-op on the CPU).
	Sync()

	// Gemm computes C = alpha*op(A)*op(B) + beta*C, row-major, where op(A)
	// is m×k and op(B) is k×n; op transposes when transA/transB is set.
	Gemm(transA, transB bool, m, n, k int, alpha float32, a Tensor, lda int, b Tensor, ldb int, beta float32, c Tensor, ldc int)
	// GemmStridedBatched runs batch independent Gemms; matrix i of A, B, C
	// starts strideA*i, strideB*i, strideC*i elements into a, b, c.
	GemmStridedBatched(transA, transB bool, m, n, k int, alpha float32, a Tensor, lda, strideA int, b Tensor, ldb, strideB int, beta float32, c Tensor, ldc, strideC int, batch int)

	// EmbeddingForward gathers rows: out[i,:] = table[tokens[i],:] for N tokens of width C.
	EmbeddingForward(out, table, tokens Tensor, N, C int)
	// EmbeddingBackward scatters: dtable[tokens[i],:] += dout[i,:].
	EmbeddingBackward(dtable, dout, tokens Tensor, N, C int)

	// RMSNormForward computes out = inp * rstd * weight per row, with
	// rstd[i] = 1/sqrt(mean(inp[i,:]^2) + eps) saved for the backward.
	RMSNormForward(out, rstd, inp, weight Tensor, N, C int, eps float32)
	// RMSNormBackward accumulates dinp and dweight.
	RMSNormBackward(dinp, dweight, dout, inp, weight, rstd Tensor, N, C int)

	// RoPEForward rotates consecutive pairs (x[2i], x[2i+1]) of each head of
	// inp [B, T, NH, HD] by the angle whose cos/sin are freqs[t, i] (tables
	// [T, HD/2]); out may alias inp.
	RoPEForward(out, inp, cos, sin Tensor, B, T, NH, HD int)
	// RoPEBackward accumulates the inverse rotation of dout into dinp.
	RoPEBackward(dinp, dout, cos, sin Tensor, B, T, NH, HD int)

	// AttentionForward computes causal softmax(q k^T / sqrt(HD)) v without
	// materialising the Tq×Tk matrix. out is [B, Tq, NH, HD]; lse
	// [B, NH, Tq] receives each row's log-sum-exp for the backward.
	AttentionForward(out, lse, q, k, v Tensor, d AttentionDims)
	// AttentionBackward accumulates dq, dk, dv from dout, recomputing the
	// probabilities from q, k, lse.
	AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse Tensor, d AttentionDims)

	// SwiGLUForward computes out = silu(gate) * up over n elements.
	SwiGLUForward(out, gate, up Tensor, n int)
	// SwiGLUBackward accumulates dgate and dup.
	SwiGLUBackward(dgate, dup, dout, gate, up Tensor, n int)

	// CrossEntropyChunk folds a vocabulary chunk of logits [N, V] (columns
	// vOff..vOff+V of the full vocabulary) into the running per-row state
	// stats [N, 3] = (max, sum of exp(x-max), target logit). stats must be
	// reset with CrossEntropyReset before the first chunk. Targets < 0 are
	// ignored rows.
	CrossEntropyChunk(stats, logits, targets Tensor, N, V, vOff int)
	// CrossEntropyReset prepares stats [N, 3] for a new pass.
	CrossEntropyReset(stats Tensor, N int)
	// CrossEntropyLoss writes losses[i] = logsumexp - target logit (0 for
	// ignored rows) from completed stats.
	CrossEntropyLoss(losses, stats, targets Tensor, N int)
	// CrossEntropyChunkBackward overwrites logits [N, V] (chunk at vOff)
	// with dloss/dlogits = scale * (softmax - onehot(target)), using the
	// completed stats. Ignored rows get zero.
	CrossEntropyChunkBackward(logits, stats, targets Tensor, N, V, vOff int, scale float32)

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
