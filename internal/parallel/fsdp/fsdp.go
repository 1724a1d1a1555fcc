// Package fsdp is sharded data parallelism: FSDP (ZeRO-3) along the
// dp_shard mesh dimension, HSDP (dp_replicate × dp_shard) and DDP
// (dp_replicate only), all driven by a model's unit hooks. It knows no
// model family: a model gives it the units of its flat parameter buffer
// (for Llama: the embedding, each transformer layer, the final norm with
// the output projection — of whatever tensor-parallel shard and pipeline
// stage the rank holds) and a function that binds a unit's views.
//
// The model's flat parameter buffer is cut into units. Every rank of the shard group stores only its chunk
// (comm.ChunkBounds) of each unit's parameters and gradients, laid end to
// end in unit order in the local buffers Params and Grads; the optimizer
// runs over those shards. Around each unit of a forward or backward pass
// the Runtime materialises the unit's full parameters by an all-gather
// (prefetching the next unit's gather while the current one computes) and
// after its backward reduce-scatters the unit's gradients into the local
// shard, overlapped with the backward of the units below. With a
// replicate group (HSDP) the reduced shard is then all-reduced across
// replicas; with a shard group of one (DDP) parameters are not gathered at
// all and each unit's gradients form one all-reduce bucket.
//
// Under pipeline parallelism a unit computes several microbatches a step.
// As FSDP2 under torch.distributed.pipelining, every backward of a unit
// but the step's last runs without gradient sync (SetGradientSync): the
// unit keeps its gathered parameters and accumulates its gradients in
// its unsharded gradient buffer, and the last backward reduces the sum
// once. A unit is then gathered and reduced once a step, not once a
// microbatch, for the memory of every unit's gathered parameters and
// gradient buffer.
//
// Collectives fold contributions in rank order, so a given layout
// reproduces bitwise from run to run.
//
// # Mixed precision
//
// As FSDP2's MixedPrecisionPolicy: with Config.Param bfloat16 each rank
// rounds its float32 parameter shards to bfloat16 once per step (the first
// use after Invalidate, that is after the optimizer step) and the
// all-gathers move bfloat16, half the bytes; the model computes with the
// gathered bfloat16 values (widened into float32 unit buffers, exactly).
// Without sharding the model is bound to a bfloat16-rounded copy of the
// local parameters, so that every layout computes with the same values.
// The float32 shards stay the masters the optimizer updates. With
// Config.Reduce bfloat16 each unit's gradient is rounded to bfloat16
// before its reduce-scatter and all-reduce (comm accumulates in float32
// and rounds the result once); the reduced shard is added to the float32
// gradient shard.
//
// # Float8 all-gather
//
// With Config.Float8AllGather the float8 linear weights of each unit
// (Config.Float8) are all-gathered as their e4m3 bytes, cast by each rank
// from its own shard with the weight's global tensorwise scale, and the
// model is told the scales (Config.BindScales); see float8.go.
// GatherStats counts the bytes of every all-gather, float8 weights apart.
package fsdp

import (
	"context"
	"fmt"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/memsnap"
	"github.com/titan-go/titan/internal/numeric"
)

// Reshard is the fsdp_reshard_after_forward policy.
type Reshard int

const (
	// ReshardDefault is torchtitan's default: ReshardAlways without
	// pipeline parallelism, ReshardNever with it (see Resolve).
	ReshardDefault Reshard = iota
	// ReshardAlways frees each unit's gathered parameters after its
	// forward and gathers them again for its backward (less memory).
	ReshardAlways
	// ReshardNever keeps every unit's gathered parameters from its forward
	// until its backward (more memory, one gather per unit and pass).
	ReshardNever
)

// ParseReshard parses parallelism.fsdp_reshard_after_forward.
func ParseReshard(s string) (Reshard, error) {
	switch s {
	case "", "default":
		return ReshardDefault, nil
	case "always":
		return ReshardAlways, nil
	case "never":
		return ReshardNever, nil
	}
	return 0, fmt.Errorf("fsdp: fsdp_reshard_after_forward %q: want default, always or never", s)
}

// Resolve returns the policy ReshardDefault stands for: ReshardNever
// under pipeline parallelism (each unit is used by several microbatches
// in turn, so gathering it once per step saves communication), and
// ReshardAlways otherwise.
func (p Reshard) Resolve(pipelined bool) Reshard {
	if p != ReshardDefault {
		return p
	}
	if pipelined {
		return ReshardNever
	}
	return ReshardAlways
}

// Config places a Runtime in the data-parallel mesh.
type Config struct {
	// Shard is the dp_shard group parameters are sharded over; nil or a
	// group of one means no sharding (DDP).
	Shard comm.Group
	// Replicate is the dp_replicate group gradients are all-reduced
	// over; nil or a group of one means no replication (FSDP).
	Replicate comm.Group
	// Reshard is the reshard-after-forward policy.
	Reshard Reshard
	// Blocking waits for every collective as soon as it is issued and
	// prefetches nothing: communication never overlaps compute. For
	// benchmarks and debugging.
	Blocking bool
	// MaxGradBuffers bounds the unit gradient buffers (the unit being
	// computed plus reductions in flight); 0 means 2.
	MaxGradBuffers int
	// Segments are the first units of the runs of units that compute
	// one after the other (a rank's pipeline stages, in order); nil is
	// one run. Prefetching stays inside a run.
	Segments []int
	// KeepLast keeps the last unit's gathered parameters after its
	// forward whatever the policy, because its backward follows at once
	// (the unit with the loss).
	KeepLast bool
	// Param is the dtype the model computes with, backend.Float32 (the
	// zero value) or backend.BFloat16 (see Mixed precision above).
	Param backend.DType
	// Reduce is the dtype of the gradient reductions, backend.Float32 or
	// backend.BFloat16.
	Reduce backend.DType
	// Float8 lists each unit's float8 linear weights (flat-buffer ranges
	// inside the unit, in order; nil: none), which GatherStats counts
	// apart and Float8AllGather gathers as float8 (see float8.go).
	Float8 [][]Range
	// Float8AllGather all-gathers the Float8 weights as float8 e4m3 with
	// tensorwise scales (enable_fsdp_float8_all_gather); BindScales then
	// gives the model each gathered unit's scales, in Float8 order, after
	// binding its parameters.
	Float8AllGather bool
	BindScales      func(u int, scales []float32)
	// Float8Peers holds, under tensor parallelism, the ranks with the
	// other tp shards of the units' float8 weights (the tp group; nil or
	// a group of one: none). The float8 all-gather's amax of each weight
	// is then max all-reduced over them too, so that its tensorwise
	// scale is the whole weight's, the scale the model casts with.
	Float8Peers comm.Group
	// PrecomputeScales computes every float8 weight's scale in one
	// all-reduce per Invalidate instead of one per weight and gather
	// (precompute_float8_dynamic_scale_for_fsdp).
	PrecomputeScales bool
}

// Range is a range [Lo, Hi) of flat-buffer elements.
type Range struct{ Lo, Hi int }

// Len is the number of elements in the range.
func (r Range) Len() int { return r.Hi - r.Lo }

// Layout is the sharding of cfg's flat buffer over parts ranks: rank's
// shard of unit u is Shards[u], stored at Local[u] in the rank's local
// buffer. It holds no buffers and needs no communication.
type Layout struct {
	Units  []Range // each unit's range of the flat buffer
	Shards []Range // this rank's chunk of each unit, in flat-buffer indices
	Local  []int   // offset of each shard in the local buffer
	Len    int     // local buffer length (sum of the shard lengths)
}

// NewLayout shards every unit over parts ranks and returns rank's part.
func NewLayout(units []Range, parts, rank int) (Layout, error) {
	if parts < 1 || rank < 0 || rank >= parts {
		return Layout{}, fmt.Errorf("fsdp: rank %d out of range for %d shards", rank, parts)
	}
	var l Layout
	for _, u := range units {
		lo, hi := comm.ChunkBounds(u.Hi-u.Lo, parts, rank)
		l.Units = append(l.Units, Range{u.Lo, u.Hi})
		l.Shards = append(l.Shards, Range{u.Lo + lo, u.Lo + hi})
		l.Local = append(l.Local, l.Len)
		l.Len += hi - lo
	}
	return l, nil
}

// Binder lays unit u's parameter views over params and its gradient
// views over grads (each holding the unit's elements; a tensor with nil
// Mem leaves those views as they are), on every model copy that computes
// with the unit.
type Binder func(u int, params, grads backend.Tensor)

// Runtime is one rank's sharded data-parallel state and the model hooks
// that gather parameters and reduce gradients unit by unit. Its
// BeforeForward, AfterForward, BeforeBackward and AfterBackward methods
// are the unit hooks the model calls.
type Runtime struct {
	Layout
	// Params and Grads are this rank's shards of the parameters and
	// gradients, Layout.Len elements each; the optimizer updates them.
	Params, Grads backend.Tensor

	be        backend.Backend
	bind      Binder
	shard     comm.Group // nil: no sharding
	replicate comm.Group // nil: no replication
	reshard   Reshard
	blocking  bool
	local1    bool // no group: parameters and gradients are bound in place
	maxGrad   int
	unitMax   int
	keepLast  bool
	segment   []int // run of each unit

	pbuf   []backend.Tensor // gathered parameters of each unit (Mem nil: none)
	pwork  []*comm.Work     // gather in flight into pbuf
	gbuf   []backend.Tensor // gradient buffer of each unit during its backward
	pfree  []backend.Tensor // free parameter buffers
	gfree  []backend.Tensor // free gradient buffers
	pAlloc int              // parameter buffers allocated
	gAlloc int              // gradient buffers allocated
	queue  []*reduction     // gradient reductions in flight, in issue order
	nosync bool             // SetGradientSync(false): backwards accumulate
	hbuf   []backend.Tensor // each unit's own gradient buffer for backwards without sync
	hAlloc int              // of them allocated

	// Mixed precision (see the package comment).
	param, reduce backend.DType
	lowp          []uint16                     // bfloat16 rounding of Params
	lowpValid     bool                         // lowp (and compute) hold the current Params
	compute       backend.Tensor               // unsharded: the bound bfloat16-valued copy of Params
	pbits         [][]uint16                   // gather in flight: its bfloat16 receive buffer, by unit
	bits          map[*backend.Memory][]uint16 // bfloat16 twin of each unit buffer
	gathers       int                          // all-gathers issued (for tests)
	reductions    int                          // unit gradient reductions issued (for tests)

	// Float8 all-gather (float8.go).
	f8          []f8plan // by unit
	nf8         int      // float8 weights over the units
	f8all       bool     // Config.Float8AllGather
	precompute  bool     // Config.PrecomputeScales
	bindScales  func(u int, scales []float32)
	f8peers     comm.Group                   // Config.Float8Peers (nil: none)
	scalesValid bool                         // precomputed scales hold the current Params
	f8recv      int                          // receive buffer length (uint16 elements)
	bits8       map[*backend.Memory][]uint16 // receive buffer of each unit buffer
	f8wide      []float32                    // bfloat16 shard widened
	stats       GatherStats
}

// reduction is one unit's gradient reduction: a reduce-scatter over the
// shard group, then an all-reduce of the shard over the replicate group.
type reduction struct {
	unit  int
	buf   backend.Tensor
	bits  []uint16 // bfloat16 reductions: the unit's rounded gradient
	work  *comm.Work
	stage int // 1: reduce-scatter in flight, 2: all-reduce in flight
}

// ctx is the context of the runtime's collectives; timeouts come from the
// groups' options.
var ctx = context.Background()

func size(g comm.Group) int {
	if g == nil {
		return 1
	}
	return g.Size()
}

// New shards the units (a tiling of a flat parameter buffer) over the
// shard group and binds them through bind; the caller installs the
// Runtime as the model's unit hooks. Parameters start at zero: call Init
// or Load.
func New(be backend.Backend, units []Range, bind Binder, c Config) (*Runtime, error) {
	shard, replicate := c.Shard, c.Replicate
	if size(shard) == 1 {
		shard = nil
	}
	if size(replicate) == 1 {
		replicate = nil
	}
	rank := 0
	if shard != nil {
		rank = shard.Rank()
	}
	lay, err := NewLayout(units, size(shard), rank)
	if err != nil {
		return nil, err
	}
	for _, d := range []struct {
		what string
		t    backend.DType
	}{{"parameter", c.Param}, {"reduction", c.Reduce}} {
		if d.t != backend.Float32 && d.t != backend.BFloat16 {
			return nil, fmt.Errorf("fsdp: %s dtype %v: want float32 or bfloat16", d.what, d.t)
		}
	}
	r := &Runtime{
		Layout: lay, be: be, bind: bind, shard: shard, replicate: replicate,
		reshard: c.Reshard, blocking: c.Blocking, maxGrad: c.MaxGradBuffers, keepLast: c.KeepLast,
		param: c.Param, reduce: c.Reduce, bits: map[*backend.Memory][]uint16{},
		bits8: map[*backend.Memory][]uint16{},
	}
	r.segment = make([]int, len(units))
	for _, first := range c.Segments {
		if first < 0 || first >= len(units) {
			return nil, fmt.Errorf("fsdp: segment start %d outside the %d units", first, len(units))
		}
		for u := first; u < len(units); u++ {
			r.segment[u]++
		}
	}
	if r.maxGrad <= 0 {
		r.maxGrad = 2
	}
	if err := r.planFloat8(c); err != nil {
		return nil, err
	}
	n := len(lay.Units)
	for _, u := range lay.Units {
		r.unitMax = max(r.unitMax, u.Len())
	}
	r.Params = be.Alloc(backend.Float32, lay.Len)
	r.Grads = be.Alloc(backend.Float32, lay.Len)
	if _, ok := r.Params.HostFloat32(); !ok {
		return nil, fmt.Errorf("fsdp: the backend's memory is not host memory; sharded data parallelism needs host buffers")
	}
	r.pbuf, r.pwork, r.gbuf, r.hbuf = make([]backend.Tensor, n), make([]*comm.Work, n), make([]backend.Tensor, n), make([]backend.Tensor, n)
	r.pbits = make([][]uint16, n)
	r.local1 = shard == nil && replicate == nil
	if r.param == backend.BFloat16 {
		r.lowp = make([]uint16, lay.Len)
	}
	if shard == nil {
		// Every rank holds whole units: the model computes on the local
		// parameters directly, or on their bfloat16 copy (and, with no
		// group at all, accumulates into the local gradients: the hooks
		// have nothing to do).
		params := r.Params
		if r.param == backend.BFloat16 {
			r.compute = be.Alloc(backend.Float32, lay.Len)
			params = r.compute
		}
		for u := range lay.Units {
			g := backend.Tensor{}
			if r.local1 {
				g = r.local(r.Grads, u)
			}
			bind(u, r.local(params, u), g)
		}
	}
	return r, nil
}

// host returns the float32 elements of a host tensor.
func host(t backend.Tensor) []float32 {
	h, _ := t.HostFloat32() // New checked the backend's memory
	return h
}

// whole is the pool buffer a unit's view was cut from.
func whole(t backend.Tensor) backend.Tensor {
	return backend.Tensor{Mem: t.Mem, Len: t.Mem.Len}
}

// local is unit u's shard inside a local buffer (Params, Grads or an
// optimizer moment).
func (r *Runtime) local(buf backend.Tensor, u int) backend.Tensor {
	return buf.Slice(r.Local[u], r.Shards[u].Len())
}

// Sharded reports whether parameters are sharded (dp_shard > 1).
func (r *Runtime) Sharded() bool { return r.shard != nil }

// Init fills this rank's parameter shards with fill(lo, dst), which
// writes the initial values of the flat-buffer elements [lo, lo+len(dst)).
func (r *Runtime) Init(fill func(lo int, dst []float32)) {
	h := host(r.Params) // New checked it is host memory: fill in place
	for u, s := range r.Shards {
		fill(s.Lo, h[r.Local[u]:r.Local[u]+s.Len()])
	}
	r.Invalidate()
}

// ZeroGrad clears the gradient shards; call it before a step's first
// backward.
func (r *Runtime) ZeroGrad() { r.be.Zero(r.Grads) }

// Invalidate drops every gathered parameter buffer (and the bfloat16
// rounding of the shards); call it whenever the parameter shards change
// (optimizer step, load).
func (r *Runtime) Invalidate() {
	r.lowpValid, r.scalesValid = false, false
	for u := range r.pbuf {
		if r.pwork[u] != nil {
			r.pwork[u].Wait() // an unused prefetch; its error resurfaces on the next collective
			r.pwork[u] = nil
		}
		r.releaseParams(u)
	}
}

// BufferBytes is the memory of the unit buffers allocated so far
// (gathered parameters and unit gradients), the transient part of the
// sharded state.
func (r *Runtime) BufferBytes() int64 {
	n := int64(r.pAlloc+r.gAlloc+r.hAlloc) * int64(r.unitMax) * 4
	// Mixed precision: the bfloat16 shards, the unsharded bound copy and
	// the bfloat16 twins of the unit buffers.
	n += int64(len(r.lowp))*2 + int64(r.compute.Len)*4
	for _, b := range r.bits {
		n += int64(len(b)) * 2
	}
	for _, b := range r.bits8 {
		n += int64(len(b)) * 2
	}
	return n
}

// StateBytes is the memory of this rank's parameter and gradient shards.
func (r *Runtime) StateBytes() int64 { return int64(r.Params.Len+r.Grads.Len) * 4 }

func (r *Runtime) paramBuf() backend.Tensor {
	if n := len(r.pfree); n > 0 {
		t := r.pfree[n-1]
		r.pfree = r.pfree[:n-1]
		return t
	}
	r.pAlloc++
	return r.be.Alloc(backend.Float32, r.unitMax)
}

func (r *Runtime) releaseParams(u int) {
	if r.shard == nil || r.pbuf[u].Mem == nil {
		return
	}
	gatheredBytes.Add(-int64(r.pbuf[u].Len) * 4)
	r.pfree = append(r.pfree, whole(r.pbuf[u]))
	r.pbuf[u] = backend.Tensor{}
}

// round makes the bfloat16 rounding of the parameter shards current (and,
// without sharding, the bound copy), once after each Invalidate.
func (r *Runtime) round() {
	if r.param != backend.BFloat16 || r.lowpValid {
		return
	}
	r.lowpValid = true
	numeric.Float32sToBF16(r.lowp, host(r.Params))
	if r.compute.Mem != nil {
		numeric.BF16sToFloat32(host(r.compute), r.lowp)
	}
}

// twin returns the bfloat16 buffer paired with unit buffer t's memory
// (the whole pool buffer), allocated on first use.
func (r *Runtime) twin(t backend.Tensor) []uint16 {
	b, ok := r.bits[t.Mem]
	if !ok {
		b = make([]uint16, t.Mem.Len)
		r.bits[t.Mem] = b
	}
	return b[t.Off : t.Off+t.Len]
}

// Gathers is the number of parameter all-gathers issued so far.
func (r *Runtime) Gathers() int { return r.gathers }

// Reductions is the number of unit gradient reductions started so far.
func (r *Runtime) Reductions() int { return r.reductions }

// gather issues the all-gather of unit u's parameters unless they are
// gathered or on their way: of the float32 shards, or of their bfloat16
// rounding into the unit buffer's bfloat16 twin (widened when it lands).
func (r *Runtime) gather(u int) error {
	if r.shard == nil || r.pbuf[u].Mem != nil {
		return nil
	}
	buf := r.paramBuf()
	full := buf.Slice(0, r.Units[u].Len())
	r.pbuf[u] = full
	gatheredBytes.Add(int64(full.Len) * 4)
	r.gathers++
	r.stats.Gathers++
	if r.float8Gather(u) {
		if err := r.gather8(u, full); err != nil {
			return err
		}
	} else if r.countGather(u); r.param == backend.BFloat16 {
		r.round()
		bits := r.twin(full)
		r.pbits[u] = bits
		r.pwork[u] = r.shard.AllGatherAsync(ctx, comm.BF16(r.lowp[r.Local[u]:r.Local[u]+r.Shards[u].Len()]), comm.BF16(bits))
	} else {
		r.pwork[u] = r.shard.AllGatherAsync(ctx, comm.F32(host(r.local(r.Params, u))), comm.F32(host(full)))
	}
	if r.blocking {
		return r.waitGather(u)
	}
	return nil
}

func (r *Runtime) waitGather(u int) error {
	w := r.pwork[u]
	if w == nil {
		return nil
	}
	r.pwork[u] = nil
	if err := w.Wait(); err != nil {
		return fmt.Errorf("fsdp: all-gather of unit %d: %w", u, err)
	}
	if bits := r.pbits[u]; bits != nil {
		if r.float8Gather(u) {
			r.unpack8(u)
		} else {
			numeric.BF16sToFloat32(host(r.pbuf[u]), bits)
		}
		r.pbits[u] = nil
	}
	return nil
}

// use makes unit u's full parameters available to the model and prefetches
// the gather of unit next (-1: none).
func (r *Runtime) use(u, next int) error {
	if r.shard == nil {
		r.round()
		return nil
	}
	if err := r.gather(u); err != nil {
		return err
	}
	if !r.blocking && next >= 0 && next < len(r.Units) && r.segment[next] == r.segment[u] {
		if err := r.gather(next); err != nil {
			return err
		}
	}
	if err := r.waitGather(u); err != nil {
		return err
	}
	r.bind(u, r.pbuf[u], backend.Tensor{})
	if r.float8Gather(u) {
		r.bindScales(u, r.scalesOf(u))
	}
	return nil
}

// BeforeForward gathers unit u (prefetching unit u+1).
func (r *Runtime) BeforeForward(u int) error { return r.use(u, u+1) }

// AfterForward frees unit u's gathered parameters unless the policy keeps
// them (or, with KeepLast, u is the last unit).
func (r *Runtime) AfterForward(u int) error {
	if r.reshard != ReshardNever && !(r.keepLast && u == len(r.Units)-1) {
		r.releaseParams(u)
	}
	return nil
}

// SetGradientSync sets whether the backwards that follow reduce their
// units' gradients (true, the default) or accumulate them unsharded for
// a later backward that does, keeping the units gathered meanwhile
// (FSDP2's set_requires_gradient_sync with set_reshard_after_backward).
// The pipeline executor turns it off for every backward of a stage but
// its last of the step.
func (r *Runtime) SetGradientSync(sync bool) { r.nosync = !sync }

// BeforeBackward gathers unit u (prefetching unit u-1) and binds its unit
// gradient buffer: the one holding its gradients of earlier backwards
// without sync, or a zeroed one.
func (r *Runtime) BeforeBackward(u int) error {
	if r.local1 {
		return nil
	}
	if err := r.use(u, u-1); err != nil {
		return err
	}
	if g := r.gbuf[u]; g.Mem != nil {
		r.bind(u, backend.Tensor{}, g)
		return nil
	}
	// A unit accumulating over backwards without sync does so in a
	// buffer of its own (allocated once); the others take one of the
	// maxGrad buffers that cycle through the reductions.
	var buf backend.Tensor
	switch {
	case r.nosync:
		if r.hbuf[u].Mem == nil {
			r.hAlloc++
			r.hbuf[u] = r.be.Alloc(backend.Float32, r.unitMax)
		}
		// Its reduction of an earlier pass (an accumulated local batch
		// of the same step) may still be reading it.
		for r.reducing(u) {
			if err := r.progress(true); err != nil {
				return err
			}
		}
		buf = r.hbuf[u]
	default:
		for len(r.gfree) == 0 && r.gAlloc >= r.maxGrad && len(r.queue) > 0 {
			if err := r.progress(true); err != nil {
				return err
			}
		}
		if n := len(r.gfree); n > 0 {
			buf = r.gfree[n-1]
			r.gfree = r.gfree[:n-1]
		} else {
			r.gAlloc++
			buf = r.be.Alloc(backend.Float32, r.unitMax)
		}
	}
	g := buf.Slice(0, r.Units[u].Len())
	r.be.Zero(g)
	r.gbuf[u] = g
	r.bind(u, backend.Tensor{}, g)
	return nil
}

// AfterBackward starts the reduction of unit u's gradients and frees its
// gathered parameters; without gradient sync it keeps both for the
// unit's next backward.
func (r *Runtime) AfterBackward(u int) error {
	if r.local1 {
		return nil
	}
	if r.nosync {
		return nil // gbuf[u] holds them for the unit's next backward
	}
	r.reduceUnit(u)
	return r.progress(r.blocking)
}

// reduceUnit starts the reduction of unit u's gradient buffer and frees
// its gathered parameters.
func (r *Runtime) reduceUnit(u int) {
	g := r.gbuf[u]
	r.gbuf[u] = backend.Tensor{}
	r.reductions++
	red := &reduction{unit: u, buf: g, stage: 1}
	send := comm.F32(host(g))
	if r.reduce == backend.BFloat16 {
		red.bits = r.twin(g)
		numeric.Float32sToBF16(red.bits, host(g))
		send = comm.BF16(red.bits)
	}
	if r.shard != nil {
		red.work = r.shard.ReduceScatterAsync(ctx, send, red.chunk(r), comm.Sum)
	} else {
		red.stage = 2
		red.work = r.replicate.AllReduceAsync(ctx, send, comm.Sum)
	}
	r.queue = append(r.queue, red)
	r.releaseParams(u)
}

// reducing reports whether a reduction of unit u's own gradient buffer
// is in flight.
func (r *Runtime) reducing(u int) bool {
	for _, red := range r.queue {
		if red.unit == u && whole(red.buf).Mem == r.hbuf[u].Mem {
			return true
		}
	}
	return false
}

// progress advances the reductions in flight, in issue order. With wait it
// completes at least the oldest one; otherwise it only takes up those that
// already finished.
func (r *Runtime) progress(wait bool) error {
	for len(r.queue) > 0 {
		red := r.queue[0]
		if !wait {
			select {
			case <-red.work.Done():
			default:
				return nil
			}
		}
		if err := red.work.Wait(); err != nil {
			return fmt.Errorf("fsdp: gradient reduction of unit %d: %w", red.unit, err)
		}
		if red.stage == 1 && r.replicate != nil {
			red.stage = 2
			red.work = r.replicate.AllReduceAsync(ctx, red.chunk(r), comm.Sum)
			if r.blocking {
				continue
			}
			// Later reductions may move on while this one all-reduces,
			// but in order: start their all-reduces behind this one.
			return r.promote()
		}
		dst := host(r.local(r.Grads, red.unit))
		s := r.Shards[red.unit]
		lo, hi := s.Lo-r.Units[red.unit].Lo, s.Hi-r.Units[red.unit].Lo
		if red.bits != nil {
			for i, v := range red.bits[lo:hi] {
				dst[i] += numeric.BF16ToFloat32(v)
			}
		} else {
			for i, v := range host(red.buf)[lo:hi] {
				dst[i] += v
			}
		}
		if whole(red.buf).Mem != r.hbuf[red.unit].Mem {
			r.gfree = append(r.gfree, whole(red.buf))
		}
		r.queue = r.queue[1:]
		if wait {
			return nil
		}
	}
	return nil
}

// promote starts the replicate all-reduce of every finished reduce-scatter
// that follows the head of the queue, in order, stopping at the first one
// still running.
func (r *Runtime) promote() error {
	for _, red := range r.queue[1:] {
		if red.stage == 2 {
			continue
		}
		select {
		case <-red.work.Done():
		default:
			return nil
		}
		if err := red.work.Wait(); err != nil {
			return fmt.Errorf("fsdp: gradient reduction of unit %d: %w", red.unit, err)
		}
		red.stage = 2
		red.work = r.replicate.AllReduceAsync(ctx, red.chunk(r), comm.Sum)
	}
	return nil
}

// chunk is this rank's shard of the reduction's unit gradient, in the
// reduction's dtype.
func (red *reduction) chunk(r *Runtime) comm.Buffer {
	s := r.Shards[red.unit]
	lo, hi := s.Lo-r.Units[red.unit].Lo, s.Hi-r.Units[red.unit].Lo
	if red.bits != nil {
		return comm.BF16(red.bits[lo:hi])
	}
	return comm.F32(host(red.buf)[lo:hi])
}

// Finish completes every gradient reduction; call it after the step's
// last backward, before reading Grads. It first reduces the gradients
// units still hold: a split backward's last pass (the weight
// gradients) with gradient sync visits only the units with deferred
// products, so the others' last backward ran without.
func (r *Runtime) Finish() error {
	for u := len(r.gbuf) - 1; u >= 0; u-- {
		if r.gbuf[u].Mem != nil { // between backwards, only held units have one
			r.reduceUnit(u)
		}
	}
	for len(r.queue) > 0 {
		if err := r.progress(true); err != nil {
			return err
		}
	}
	return nil
}

// SumSquares is the sum of squares of the whole (unsharded) gradient.
func (r *Runtime) SumSquares() (float64, error) {
	v := []float64{r.be.SumSquares(r.Grads)}
	if r.shard != nil {
		if err := r.shard.AllReduce(ctx, comm.F64(v), comm.Sum); err != nil {
			return 0, fmt.Errorf("fsdp: gradient norm: %w", err)
		}
	}
	return v[0], nil
}

// GatherFull returns the whole flat buffer whose local shards are in buf
// (Params, Grads or an optimizer moment), on every rank of the shard
// group. It is a collective over the shard group.
func (r *Runtime) GatherFull(buf backend.Tensor) ([]float32, error) {
	if buf.Len != r.Len {
		return nil, fmt.Errorf("fsdp: gather: buffer of %d elements, the shards hold %d", buf.Len, r.Len)
	}
	loc := make([]float32, r.Len)
	r.be.Download(loc, buf)
	full := make([]float32, r.Units[len(r.Units)-1].Hi)
	for u, s := range r.Shards {
		mine := loc[r.Local[u] : r.Local[u]+s.Len()]
		dst := full[r.Units[u].Lo:r.Units[u].Hi]
		if r.shard == nil {
			copy(dst, mine)
			continue
		}
		if err := r.shard.AllGather(ctx, comm.F32(mine), comm.F32(dst)); err != nil {
			return nil, fmt.Errorf("fsdp: gathering unit %d: %w", u, err)
		}
	}
	return full, nil
}

// Load fills buf (Params or an optimizer moment) with this rank's shards,
// read by read(lo, dst), which must fill dst with the flat-buffer elements
// [lo, lo+len(dst)). On an error buf may hold part of them.
func (r *Runtime) Load(buf backend.Tensor, read func(lo int, dst []float32) error) error {
	if buf.Len != r.Len {
		return fmt.Errorf("fsdp: load: buffer of %d elements, the shards hold %d", buf.Len, r.Len)
	}
	// Host memory is read into in place: a staging copy of the shards
	// raised a resumed run's peak memory by its size for each buffer.
	h, inPlace := buf.HostFloat32()
	if !inPlace {
		h = make([]float32, r.Len)
	}
	for u, s := range r.Shards {
		if err := read(s.Lo, h[r.Local[u]:r.Local[u]+s.Len()]); err != nil {
			return err
		}
	}
	if !inPlace {
		r.be.Upload(buf, h)
	}
	r.Invalidate()
	return nil
}

// gatheredBytes is the memory of the gathered unit parameters in use,
// over the process's runtimes (GatheredBytes).
var gatheredBytes memsnap.Gauge

// GatheredBytes is the memory of the units' gathered parameters in use
// now (gathered or being gathered, not yet freed), over every Runtime of
// the process: the part of FSDP's memory that rises and falls within a
// step (memory snapshots sample it).
func GatheredBytes() int64 { return gatheredBytes.Load() }

// GatheredPeak is the most GatheredBytes since its last call.
func GatheredPeak() int64 { return gatheredBytes.TakePeak() }

// GatheredBuffers is the number of unit parameter buffers allocated so
// far: the most units whose gathered parameters were alive at once.
func (r *Runtime) GatheredBuffers() int { return r.pAlloc }
