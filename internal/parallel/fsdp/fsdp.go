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
// Collectives fold contributions in rank order, so a given layout
// reproduces bitwise from run to run.
package fsdp

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/comm"
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
}

// reduction is one unit's gradient reduction: a reduce-scatter over the
// shard group, then an all-reduce of the shard over the replicate group.
type reduction struct {
	unit  int
	buf   backend.Tensor
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
	r := &Runtime{
		Layout: lay, be: be, bind: bind, shard: shard, replicate: replicate,
		reshard: c.Reshard, blocking: c.Blocking, maxGrad: c.MaxGradBuffers, keepLast: c.KeepLast,
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
	n := len(lay.Units)
	for _, u := range lay.Units {
		r.unitMax = max(r.unitMax, u.Len())
	}
	r.Params = be.Alloc(backend.Float32, lay.Len)
	r.Grads = be.Alloc(backend.Float32, lay.Len)
	if _, ok := r.Params.HostFloat32(); !ok {
		return nil, fmt.Errorf("fsdp: the backend's memory is not host memory; sharded data parallelism needs host buffers")
	}
	r.pbuf, r.pwork, r.gbuf = make([]backend.Tensor, n), make([]*comm.Work, n), make([]backend.Tensor, n)
	r.local1 = shard == nil && replicate == nil
	if shard == nil {
		// Every rank holds whole units: the model computes on the local
		// parameters directly (and, with no group at all, accumulates
		// into the local gradients: the hooks have nothing to do).
		for u := range lay.Units {
			g := backend.Tensor{}
			if r.local1 {
				g = r.local(r.Grads, u)
			}
			bind(u, r.local(r.Params, u), g)
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
	h := make([]float32, r.Len)
	for u, s := range r.Shards {
		fill(s.Lo, h[r.Local[u]:r.Local[u]+s.Len()])
	}
	r.be.Upload(r.Params, h)
	r.Invalidate()
}

// ZeroGrad clears the gradient shards; call it before a step's first
// backward.
func (r *Runtime) ZeroGrad() { r.be.Zero(r.Grads) }

// Invalidate drops every gathered parameter buffer; call it whenever the
// parameter shards change (optimizer step, load).
func (r *Runtime) Invalidate() {
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
	return int64(r.pAlloc+r.gAlloc) * int64(r.unitMax) * 4
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

// gather issues the all-gather of unit u's parameters unless they are
// gathered or on their way.
func (r *Runtime) gather(u int) error {
	if r.shard == nil || r.pbuf[u].Mem != nil {
		return nil
	}
	buf := r.paramBuf()
	full := buf.Slice(0, r.Units[u].Len())
	r.pbuf[u] = full
	gatheredBytes.Add(int64(full.Len) * 4)
	r.pwork[u] = r.shard.AllGatherAsync(ctx, comm.F32(host(r.local(r.Params, u))), comm.F32(host(full)))
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
	return nil
}

// use makes unit u's full parameters available to the model and prefetches
// the gather of unit next (-1: none).
func (r *Runtime) use(u, next int) error {
	if r.shard == nil {
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

// BeforeBackward gathers unit u (prefetching unit u-1) and binds a zeroed
// unit gradient buffer.
func (r *Runtime) BeforeBackward(u int) error {
	if r.local1 {
		return nil
	}
	if err := r.use(u, u-1); err != nil {
		return err
	}
	for len(r.gfree) == 0 && r.gAlloc >= r.maxGrad {
		if err := r.progress(true); err != nil {
			return err
		}
	}
	var buf backend.Tensor
	if n := len(r.gfree); n > 0 {
		buf = r.gfree[n-1]
		r.gfree = r.gfree[:n-1]
	} else {
		r.gAlloc++
		buf = r.be.Alloc(backend.Float32, r.unitMax)
	}
	g := buf.Slice(0, r.Units[u].Len())
	r.be.Zero(g)
	r.gbuf[u] = g
	r.bind(u, backend.Tensor{}, g)
	return nil
}

// AfterBackward starts the reduction of unit u's gradients and frees its
// gathered parameters.
func (r *Runtime) AfterBackward(u int) error {
	if r.local1 {
		return nil
	}
	g := r.gbuf[u]
	r.gbuf[u] = backend.Tensor{}
	red := &reduction{unit: u, buf: g, stage: 1}
	if r.shard != nil {
		chunk := host(g)[r.Shards[u].Lo-r.Units[u].Lo : r.Shards[u].Hi-r.Units[u].Lo]
		red.work = r.shard.ReduceScatterAsync(ctx, comm.F32(host(g)), comm.F32(chunk), comm.Sum)
	} else {
		red.stage = 2
		red.work = r.replicate.AllReduceAsync(ctx, comm.F32(host(g)), comm.Sum)
	}
	r.queue = append(r.queue, red)
	r.releaseParams(u)
	return r.progress(r.blocking)
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
		s := r.Shards[red.unit]
		chunk := host(red.buf)[s.Lo-r.Units[red.unit].Lo : s.Hi-r.Units[red.unit].Lo]
		if red.stage == 1 && r.replicate != nil {
			red.stage = 2
			red.work = r.replicate.AllReduceAsync(ctx, comm.F32(chunk), comm.Sum)
			if r.blocking {
				continue
			}
			// Later reductions may move on while this one all-reduces,
			// but in order: start their all-reduces behind this one.
			return r.promote()
		}
		dst := host(r.local(r.Grads, red.unit))
		for i, v := range chunk {
			dst[i] += v
		}
		r.gfree = append(r.gfree, whole(red.buf))
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
		s := r.Shards[red.unit]
		chunk := host(red.buf)[s.Lo-r.Units[red.unit].Lo : s.Hi-r.Units[red.unit].Lo]
		red.stage = 2
		red.work = r.replicate.AllReduceAsync(ctx, comm.F32(chunk), comm.Sum)
	}
	return nil
}

// Finish completes every gradient reduction; call it after the step's
// last backward, before reading Grads.
func (r *Runtime) Finish() error {
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
// [lo, lo+len(dst)).
func (r *Runtime) Load(buf backend.Tensor, read func(lo int, dst []float32) error) error {
	if buf.Len != r.Len {
		return fmt.Errorf("fsdp: load: buffer of %d elements, the shards hold %d", buf.Len, r.Len)
	}
	h := make([]float32, r.Len)
	for u, s := range r.Shards {
		if err := read(s.Lo, h[r.Local[u]:r.Local[u]+s.Len()]); err != nil {
			return err
		}
	}
	r.be.Upload(buf, h)
	r.Invalidate()
	return nil
}

// gatheredBytes is the memory of the gathered unit parameters in use,
// over the process's runtimes (GatheredBytes).
var gatheredBytes atomic.Int64

// GatheredBytes is the memory of the units' gathered parameters in use
// now (gathered or being gathered, not yet freed), over every Runtime of
// the process: the part of FSDP's memory that rises and falls within a
// step (memory snapshots sample it).
func GatheredBytes() int64 { return gatheredBytes.Load() }

// GatheredBuffers is the number of unit parameter buffers allocated so
// far: the most units whose gathered parameters were alive at once.
func (r *Runtime) GatheredBuffers() int { return r.pAlloc }
