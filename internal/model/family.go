// Package model is the seam between a model family (internal/model/llama,
// and the families that follow) and the code that parallelises and
// trains it (internal/parallel, internal/train). A family gives, as data
// and small functions, what the engines need: its layers and units
// (ranges of a flat parameter buffer that FSDP gathers and reduces as a
// whole), how tensor parallelism splits its parameters, and parts — one
// rank's computing share of the model (a tensor-/context-parallel shard
// of a range of layers) — that run forward and backward and call unit
// hooks. Nothing here knows of a particular family, and no family knows
// of FSDP, DDP or pipeline schedules.
package model

import (
	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/comm"
)

// Range is the range [Lo, Hi) of elements of a flat buffer.
type Range struct{ Lo, Hi int }

// Len is the number of elements of the range.
func (r Range) Len() int { return r.Hi - r.Lo }

// StageSpec is the part of a model one pipeline stage computes: layers
// [FirstLayer, FirstLayer+NumLayers), preceded by the input embedding
// when Embedding is set and followed by the output head and the loss when
// Head is set. The whole model is {0, NumLayers, true, true}.
type StageSpec struct {
	FirstLayer, NumLayers int
	Embedding, Head       bool
}

// Tensor is one named parameter of a model's flat buffer (one process's
// layout): elements [Offset, Offset+Size), row-major of Shape.
type Tensor struct {
	Name         string
	Shape        []int
	Offset, Size int
}

// Placement is what one rank holds of a model: its place in the tensor-
// and context-parallel groups and the pipeline stage it computes.
type Placement struct {
	// TP and CP are the degrees (at least 1), TPRank and CPRank this
	// rank's places.
	TP, TPRank, CP, CPRank int
	// TPGroup and CPGroup reach the peers (nil for degree 1).
	TPGroup, CPGroup comm.Group
	// Stage is the part of the model's depth the rank computes.
	Stage StageSpec
	// Precision is how the part computes.
	Precision Precision
	// Host, when set, is the staging memory the rank's parts share.
	Host *HostScratch
	// Scratch, when set, is the device memory the activation sets of the
	// rank share (see ActivationScratch); nil: the part has its own.
	Scratch *ActivationScratch
	// Split, when set, is the memory of split backwards the activation
	// sets of the stage share (see SplitPool); nil: the part's own.
	Split *SplitPool
}

// UnitHooks are called by a part's forward and backward around each unit
// (see Part.Units): BeforeForward(u) before the first use of unit u's
// parameters in a forward pass and AfterForward(u) after the last;
// BeforeBackward(u) before unit u's parameters and gradients are used in
// the backward pass and AfterBackward(u) once its gradients are complete
// for the pass. Forward visits units in increasing order, backward in
// decreasing order; a split backward calls the backward hooks in both of
// its halves. A hook's error aborts the pass.
type UnitHooks interface {
	BeforeForward(unit int) error
	AfterForward(unit int) error
	BeforeBackward(unit int) error
	AfterBackward(unit int) error
}

// Part is one activation set of a rank's share of a model, sized for
// microbatches of B rows: it computes with parameters the engine binds
// unit by unit and accumulates gradients into the buffers bound likewise.
// Several parts of the same stage (one per microbatch in flight) share
// the bound buffers.
type Part interface {
	// Units are the units of the part's flat buffer, in order; they tile
	// it. Replicated are the ranges whose parameters every tp rank holds
	// whole: their gradients are partial sums the engine adds up over the
	// tp group and counts once in the gradient norm.
	Units() []Range
	Replicated() []Range
	// BindUnit lays unit u's parameter views over params and its gradient
	// views over grads (each holding the unit's elements; a tensor with
	// nil Mem leaves those views as they are).
	BindUnit(u int, params, grads backend.Tensor)
	// SetHooks installs the unit hooks (nil: none).
	SetHooks(h UnitHooks)
	// Forward runs the part on this rank's tokens of a microbatch; the
	// stage with the head also computes the loss against targets (-1:
	// ignored). A stage without the embedding reads its input from
	// Input(), which the caller filled.
	Forward(tokens, targets []int32) error
	// LossSum is the sum of the per-token losses of the last Forward
	// (stage with the head).
	LossSum() float64
	// Backward accumulates the gradient of scale × LossSum; a stage
	// without the head back-propagates what the caller left in
	// GradOutput(). BackwardInput and BackwardWeight split it in two
	// (zero-bubble schedules), or BackwardInput runs all of it when the
	// part cannot split (see CanSplit).
	Backward(scale float32) error
	BackwardInput(scale float32) error
	BackwardWeight() error
	// CanSplit reports whether BackwardInput defers work to
	// BackwardWeight; ReserveSplit makes the memory that needs for n
	// microbatches between the two halves at once (Placement.Split's).
	CanSplit() bool
	ReserveSplit(n int)
	// Input and Output are the hidden states entering and leaving the
	// part, GradOutput and GradInput their gradients.
	Input() backend.Tensor
	Output() backend.Tensor
	GradOutput() backend.Tensor
	GradInput() backend.Tensor
	// ActivationBytes is the part's planned activation memory.
	ActivationBytes() int64
}

// Float8Part is a Part whose tensorwise float8 linear weights FSDP can
// all-gather as float8 (float8.enable_fsdp_float8_all_gather).
type Float8Part interface {
	// Float8Weights are unit u's float8 weights, ranges of the part's
	// flat buffer in order.
	Float8Weights(u int) []Range
	// BindFloat8Scales says that unit u's bound float8 weights hold their
	// e4m3 values cast with scales (in Float8Weights order): the part
	// multiplies them as they are until the unit is bound again.
	BindFloat8Scales(u int, scales []float32)
}

// Family is a model of one family and shape, with its training settings
// (such as activation checkpointing), as the engines see it.
type Family interface {
	// Name names the family and shape, for messages.
	Name() string
	// NumLayers is the depth the pipeline splits into stages.
	NumLayers() int
	// Tensors are the whole model's parameters in flat-buffer order,
	// named as checkpoints store them.
	Tensors() []Tensor
	// VocabSize and MaxSeqLen bound the token ids and the sequences.
	VocabSize() int
	MaxSeqLen() int
	// FLOPsPerToken is the training FLOPs (forward and backward) per
	// token of sequences of T tokens, for MFU.
	FLOPsPerToken(T int) float64
	// PassFLOPs is the FLOPs per token of stage s's forward, of its
	// input gradient (with what activation checkpointing recomputes) and
	// of its weight gradient (0 when the backward cannot split: the input
	// gradient is then the whole backward), for sequences of T tokens:
	// its layers' and its head's products and attention, the costs a
	// pipeline schedule is ordered and simulated for.
	PassFLOPs(T int, s StageSpec) (forward, input, weight float64)
	// Check reports why the model cannot train sequences of T tokens
	// with tensor parallel degree tp and context parallel degree cp.
	Check(T, tp, cp int) error
	// NewPart plans and allocates one activation set of the share pl
	// for microbatches of B rows of T tokens; its parameters are bound
	// by the caller.
	NewPart(be backend.Backend, B, T int, pl Placement) (Part, error)
	// ShardLen is the length of a tp rank's flat buffer (the whole
	// model's, tp-sharded), and StageRange the part of it a stage's
	// parameters occupy; a Part's flat buffer is that range.
	ShardLen(tp int) int
	StageRange(s StageSpec, tp int) Range
	// Init writes into dst the initial values (for seed) of the elements
	// [lo, lo+len(dst)) of tp rank tpRank's flat buffer, exactly the
	// values a one-process initialisation gives them.
	Init(seed uint64, tp, tpRank, lo int, dst []float32)
	// Read fills dst with the elements [lo, lo+len(dst)) of tp rank
	// tpRank's flat buffer from the whole tensors prefix+<parameter> of a
	// checkpoint.
	Read(r *checkpoint.Reader, prefix string, tp, tpRank, lo int, dst []float32) error
	// Write is the inverse of Read: it calls put with every run of src,
	// the elements [lo, lo+len(src)) of tp rank tpRank's flat buffer,
	// that is a contiguous range of one whole tensor (its name, shape and
	// element offset); the run's data aliases src. Elements every tp rank
	// holds (replicated parameters) are put by tp rank 0 only, so that a
	// tp group puts every element of the model once.
	Write(tp, tpRank, lo int, src []float32, put func(name string, shape []int, offset int, data []float32))
	// Unshard assembles the whole flat buffer (one process's layout)
	// from every tp rank's flat buffer, locals[r] from rank r.
	Unshard(locals [][]float32) []float32
	// Rows returns the tokens context-parallel rank cpRank of cp holds
	// of the rows x (rows of T tokens), in the order its parts expect.
	Rows(x []int32, T, cp, cpRank int) []int32
}

// ScratchSizer is a Family that can say, before any part exists, how
// much of a Placement.Scratch a part takes, so that the parts of one
// rank's stages, whose shapes differ, share one scratch sized for the
// largest (ActivationScratch.Reserve).
type ScratchSizer interface {
	// ScratchLen is the float32 and bfloat16 elements NewPart(be, B, T,
	// pl) takes from pl.Scratch.
	ScratchLen(B, T int, pl Placement) (n, nh int, err error)
}

// Copy is a range of a stage part's flat buffer (Local) that holds a copy
// of parameters another stage owns (Source, in the tp rank's flat
// buffer), such as a head tied to the embedding on a stage without it.
// The engine keeps the copy equal to its source: it initialises and
// loads it from the source, sums the two gradients, and leaves it out of
// the gradient norm and of saved state. A Copy is a whole unit of the
// part.
type Copy struct{ Local, Source Range }

// Copier is a Family whose stages may hold copies (see Copy).
type Copier interface {
	// Copies lists stage s's copies in increasing Local order; the rest
	// of its part's buffer is StageRange(s, tp), in order.
	Copies(s StageSpec, tp int) []Copy
}

// StageCopies returns fam's copies for stage s (none unless fam is a
// Copier).
func StageCopies(fam Family, s StageSpec, tp int) []Copy {
	if c, ok := fam.(Copier); ok {
		return c.Copies(s, tp)
	}
	return nil
}
