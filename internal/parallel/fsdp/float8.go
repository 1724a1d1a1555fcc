package fsdp

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/float8"
	"github.com/titan-go/titan/internal/numeric"
)

// This file is the float8 all-gather (torchao's
// enable_fsdp_float8_all_gather, tensorwise scales): the float8 linear
// weights of a unit (Config.Float8) travel as their e4m3 bytes, one per
// element, the unit's other parameters in the parameter dtype. Each rank
// casts its own shard of a weight with the weight's global tensorwise
// scale, float8.Scale of the amax all-reduced with Max over the shard
// group, so the gathered weight is bitwise the float8 tensor an unsharded
// run casts from the same values. The unit buffer then holds the e4m3
// values (as float32, exactly) and Config.BindScales hands the model the
// scales, so that it multiplies them without casting again.
//
// Under tensor parallelism a weight's shard group holds one tp shard of
// it: the amax is max all-reduced over Config.Float8Peers too (after the
// shard group, in one collective for the unit or the runtime), so that
// the scale is the whole weight's.
//
// Without Config.PrecomputeScales each gather all-reduces the amax of
// each of the unit's weights (one collective per weight, as torchao's
// pre-all-gather hook; issued together, then waited for); with it, the first gather after Invalidate (the
// optimizer step) all-reduces every weight's amax of the runtime in one
// collective and the scales serve every gather until the next
// Invalidate.
//
// Each rank's part of a float8 all-gather is its chunk of the unit packed
// as bytes (float8 elements one byte, the others 4 or 2), padded to the
// longest rank's part, carried in a 16-bit comm buffer (comm moves it
// without arithmetic).

// GatherStats counts what the parameter all-gathers delivered to this
// rank (every rank's part of each gathered unit) since New.
type GatherStats struct {
	// Gathers is the number of parameter all-gathers.
	Gathers int
	// Float8Weights are the bytes of the Config.Float8 weights: one per
	// element with the float8 all-gather, else the parameter dtype's
	// size; Other those of the other parameters; Padding those that pad
	// the ranks' parts of float8 all-gathers to one length.
	Float8Weights, Other, Padding int64
	// ScaleReductions is the number of all-reduces of float8 amaxes.
	ScaleReductions int
}

// Bytes is the total the all-gathers moved.
func (s GatherStats) Bytes() int64 { return s.Float8Weights + s.Other + s.Padding }

// GatherStats returns the all-gather counts so far.
func (r *Runtime) GatherStats() GatherStats { return r.stats }

// seg is a run of a rank's chunk of a unit: elements [lo, hi) of the
// unit, in float8 weight w (-1: not a float8 weight).
type seg struct{ lo, hi, w int }

// f8plan is one unit's float8 all-gather.
type f8plan struct {
	weights []Range // the unit's float8 weights, unit-relative, in order
	first   int     // index of weights[0] among the runtime's float8 weights
	chunks  [][]seg // each rank's chunk, cut into runs
	part    int     // uint16 elements of each rank's part
	n8      int     // float8 elements of the unit
	scales  []float32
}

// planFloat8 checks Config.Float8 and plans the float8 all-gathers.
func (r *Runtime) planFloat8(c Config) error {
	if len(c.Float8) > 0 && len(c.Float8) != len(r.Units) {
		return fmt.Errorf("fsdp: float8 weights given for %d units, the runtime has %d", len(c.Float8), len(r.Units))
	}
	if c.PrecomputeScales && !c.Float8AllGather {
		return fmt.Errorf("fsdp: precomputed float8 scales need the float8 all-gather")
	}
	if c.Float8AllGather && c.BindScales == nil {
		return fmt.Errorf("fsdp: the float8 all-gather needs BindScales")
	}
	r.f8all, r.precompute, r.bindScales = c.Float8AllGather, c.PrecomputeScales, c.BindScales
	if size(c.Float8Peers) > 1 {
		r.f8peers = c.Float8Peers
	}
	r.f8 = make([]f8plan, len(r.Units))
	parts := size(r.shard)
	for u, unit := range r.Units {
		p := &r.f8[u]
		p.first = r.nf8
		var ws []Range
		if len(c.Float8) > 0 {
			ws = c.Float8[u]
		}
		for i, w := range ws {
			if w.Lo < unit.Lo || w.Hi > unit.Hi || w.Lo >= w.Hi || i > 0 && w.Lo < ws[i-1].Hi {
				return fmt.Errorf("fsdp: float8 weight %v of unit %d (%v): want non-empty ranges inside the unit, in order", w, u, unit)
			}
			p.weights = append(p.weights, Range{w.Lo - unit.Lo, w.Hi - unit.Lo})
			p.n8 += w.Len()
		}
		r.nf8 += len(ws)
		p.scales = make([]float32, len(ws))
		if !r.f8all || len(ws) == 0 || r.shard == nil {
			continue
		}
		p.chunks, p.part = float8Chunks(unit.Len(), p.weights, parts, r.param.Size())
		r.f8recv = max(r.f8recv, p.part*parts)
	}
	return nil
}

// float8Chunks cuts a unit of n elements with float8 weights (unit-
// relative ranges, in order) into the chunks of parts ranks, each into
// runs, and returns the uint16 elements of each rank's part of the
// all-gather: its float8 bytes and its other elements at esize bytes,
// rounded up to whole uint16s, for the largest chunk.
func float8Chunks(n int, weights []Range, parts, esize int) (chunks [][]seg, part int) {
	maxBytes := 0
	for k := 0; k < parts; k++ {
		lo, hi := comm.ChunkBounds(n, parts, k)
		segs := cut(lo, hi, weights)
		b := 0
		for _, s := range segs {
			if s.w >= 0 {
				b += s.hi - s.lo
			} else {
				b += (s.hi - s.lo) * esize
			}
		}
		maxBytes = max(maxBytes, b)
		chunks = append(chunks, segs)
	}
	return chunks, (maxBytes + 1) / 2
}

// Float8ReceiveBytes is the size of the float8 all-gather's receive
// buffer that a runtime sharding units over parts ranks with the float8
// weights float8 (Config.Float8, in the units' frame) pairs with each of
// its gathered-unit buffers (see BufferBytes; param is the parameter
// dtype): the largest float8 unit's parts. Zero without float8 weights.
func Float8ReceiveBytes(units []Range, float8 [][]Range, parts int, param backend.DType) int64 {
	recv := 0
	for u, unit := range units {
		if u >= len(float8) || len(float8[u]) == 0 {
			continue
		}
		ws := make([]Range, len(float8[u]))
		for i, w := range float8[u] {
			ws[i] = Range{w.Lo - unit.Lo, w.Hi - unit.Lo}
		}
		_, part := float8Chunks(unit.Len(), ws, parts, param.Size())
		recv = max(recv, part*parts)
	}
	return int64(recv) * 2
}

// cut splits [lo, hi) into runs inside and outside the weights.
func cut(lo, hi int, weights []Range) []seg {
	var out []seg
	for lo < hi {
		s := seg{lo, hi, -1}
		for w, r := range weights {
			if lo >= r.Lo && lo < r.Hi {
				s = seg{lo, min(hi, r.Hi), w}
				break
			}
			if r.Lo > lo {
				s.hi = min(hi, r.Lo)
				break
			}
		}
		out = append(out, s)
		lo = s.hi
	}
	return out
}

// float8Gather reports whether unit u is all-gathered in float8.
func (r *Runtime) float8Gather(u int) bool { return r.f8[u].part > 0 }

// values returns the local shard of unit u as the model computes with it:
// the float32 parameters, or their bfloat16 rounding widened.
func (r *Runtime) values(u int) []float32 {
	if r.param != backend.BFloat16 {
		return host(r.local(r.Params, u))
	}
	r.round()
	n := r.Shards[u].Len()
	if len(r.f8wide) < n {
		r.f8wide = make([]float32, r.unitMax)
	}
	numeric.BF16sToFloat32(r.f8wide[:n], r.lowp[r.Local[u]:r.Local[u]+n])
	return r.f8wide[:n]
}

// localAmax writes into amax[i] the largest |x| of this rank's part of
// each float8 weight of unit u.
func (r *Runtime) localAmax(u int, amax []float32) {
	p := &r.f8[u]
	v := r.values(u)
	off := r.Shards[u].Lo - r.Units[u].Lo
	for i, w := range p.weights {
		lo, hi := max(w.Lo, off), min(w.Hi, off+len(v))
		amax[i] = 0
		if lo < hi {
			amax[i] = float8.Amax(v[lo-off : hi-off])
		}
	}
}

// scalesFor makes unit u's float8 scales current: the global amax of each
// weight, all-reduced with Max over the shard group, once per weight, or
// every weight's at once after each Invalidate (PrecomputeScales).
func (r *Runtime) scalesFor(u int) error {
	if r.precompute {
		if r.scalesValid {
			return nil
		}
		all := make([]float32, r.nf8)
		for v := range r.Units {
			if r.float8Gather(v) {
				r.localAmax(v, all[r.f8[v].first:r.f8[v].first+len(r.f8[v].weights)])
			}
		}
		r.stats.ScaleReductions++
		if err := r.shard.AllReduce(ctx, comm.F32(all), comm.Max); err != nil {
			return fmt.Errorf("fsdp: float8 amax all-reduce: %w", err)
		}
		if err := r.peerAmax(all); err != nil {
			return err
		}
		for v := range r.Units {
			p := &r.f8[v]
			for i := range p.scales {
				p.scales[i] = float8.Scale(all[p.first+i], float8.E4M3, false)
			}
		}
		r.scalesValid = true
		return nil
	}
	p := &r.f8[u]
	amax := make([]float32, len(p.weights))
	r.localAmax(u, amax)
	works := make([]*comm.Work, len(amax))
	for i := range amax {
		r.stats.ScaleReductions++
		works[i] = r.shard.AllReduceAsync(ctx, comm.F32(amax[i:i+1]), comm.Max)
	}
	for i, w := range works {
		if err := w.Wait(); err != nil {
			return fmt.Errorf("fsdp: float8 amax all-reduce of unit %d weight %d: %w", u, i, err)
		}
	}
	if err := r.peerAmax(amax); err != nil {
		return fmt.Errorf("unit %d: %w", u, err)
	}
	for i, a := range amax {
		p.scales[i] = float8.Scale(a, float8.E4M3, false)
	}
	return nil
}

// peerAmax max all-reduces the shard group's amaxes over Float8Peers
// (the weights' other tp shards), in one collective; nothing without
// peers.
func (r *Runtime) peerAmax(amax []float32) error {
	if r.f8peers == nil || len(amax) == 0 {
		return nil
	}
	r.stats.ScaleReductions++
	if err := r.f8peers.AllReduce(ctx, comm.F32(amax), comm.Max); err != nil {
		return fmt.Errorf("fsdp: float8 amax all-reduce over the tp shards: %w", err)
	}
	return nil
}

// bytes8 is b's memory as bytes.
func bytes8(b []uint16) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(b))), 2*len(b))
}

// gather8 issues unit u's float8 all-gather into full (the unit buffer):
// scales, then this rank's part packed into its chunk of the receive
// buffer (full's 16-bit twin).
func (r *Runtime) gather8(u int, full backend.Tensor) error {
	if err := r.scalesFor(u); err != nil {
		return err
	}
	p := &r.f8[u]
	parts, rank := size(r.shard), r.shard.Rank()
	recv := r.twin8(full)[:p.part*parts]
	mine := recv[rank*p.part : (rank+1)*p.part]
	buf := bytes8(mine)
	v := r.values(u)
	off := r.Shards[u].Lo - r.Units[u].Lo
	at := 0
	for _, s := range p.chunks[rank] {
		src := v[s.lo-off : s.hi-off]
		switch {
		case s.w >= 0:
			float8.CastE4M3(buf[at:at+len(src)], src, p.scales[s.w])
			at += len(src)
		case r.param == backend.BFloat16:
			for _, x := range src {
				binary.LittleEndian.PutUint16(buf[at:], numeric.Float32ToBF16(x))
				at += 2
			}
		default:
			for _, x := range src {
				binary.LittleEndian.PutUint32(buf[at:], math.Float32bits(x))
				at += 4
			}
		}
	}
	clear(buf[at:])
	r.stats.Float8Weights += int64(p.n8)
	other := int64((r.Units[u].Len() - p.n8) * r.param.Size())
	r.stats.Other += other
	r.stats.Padding += int64(2*len(recv)) - int64(p.n8) - other
	r.pbits[u] = recv
	r.pwork[u] = r.shard.AllGatherAsync(ctx, comm.BF16(mine), comm.BF16(recv))
	return nil
}

// unpack8 widens unit u's landed float8 all-gather into its unit buffer.
func (r *Runtime) unpack8(u int) {
	p := &r.f8[u]
	dst := host(r.pbuf[u])
	recv := r.pbits[u]
	for k, segs := range p.chunks {
		buf := bytes8(recv[k*p.part : (k+1)*p.part])
		at := 0
		for _, s := range segs {
			out := dst[s.lo:s.hi]
			switch {
			case s.w >= 0:
				float8.WidenE4M3(out, buf[at:at+len(out)])
				at += len(out)
			case r.param == backend.BFloat16:
				for i := range out {
					out[i] = numeric.BF16ToFloat32(binary.LittleEndian.Uint16(buf[at:]))
					at += 2
				}
			default:
				for i := range out {
					out[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[at:]))
					at += 4
				}
			}
		}
	}
}

// twin8 returns the float8 all-gather receive buffer paired with unit
// buffer t's memory, allocated on first use.
func (r *Runtime) twin8(t backend.Tensor) []uint16 {
	b, ok := r.bits8[t.Mem]
	if !ok {
		b = make([]uint16, r.f8recv)
		r.bits8[t.Mem] = b
	}
	return b
}

// countGather adds a gather of unit u in the parameter dtype to the stats.
func (r *Runtime) countGather(u int) {
	n8 := 0
	if r.f8 != nil {
		n8 = r.f8[u].n8
	}
	r.stats.Float8Weights += int64(n8 * r.param.Size())
	r.stats.Other += int64((r.Units[u].Len() - n8) * r.param.Size())
}

// scalesOf returns unit u's scales for BindScales (a copy).
func (r *Runtime) scalesOf(u int) []float32 { return slices.Clone(r.f8[u].scales) }
