package llama

import (
	"fmt"

	"github.com/titan-go/titan/internal/model"

	"github.com/titan-go/titan/internal/backend"
)

// Plan says what part of the model one rank holds and how it computes.
// Its zero value is the whole model on one process: every parameter,
// every layer, no communication.
//
// A tensor-parallel rank (TP > 1) holds Megatron-style shards:
// column-parallel wq, wk, wv, w1, w3, row-parallel wo, w2, and the
// vocabulary-parallel embedding and output; the residual stream and the
// norms are split along the tokens (sequence parallel) and the
// cross-entropy is computed from the vocabulary shards' statistics (loss
// parallel). A context-parallel rank (CP > 1) holds a head and a tail
// chunk of every sequence and runs ring attention. A pipeline stage
// (Stage) holds a range of layers, with the embedding and the head only
// if the stage has them. The layers are computed by the same code in
// every case; at TP = CP = 1 no collective and no extra copy runs.
type Plan struct {
	// TP and CP are the tensor and context parallel degrees (0 means 1),
	// TPRank and CPRank this rank's place in its groups.
	TP, TPRank, CP, CPRank int
	// Comm reaches the rank's tp and cp peers; required when TP×CP > 1.
	Comm ParallelComm
	// Host, when set, holds the host staging buffers of the collectives
	// (see HostBytesFor), shared with the rank's other models, which
	// must not compute at the same time; nil: the model's own.
	Host *model.HostScratch
	// Scratch, when set, holds the activation memory a pass needs only
	// while it runs (see ScratchLen), shared with the rank's other
	// models, which must not compute at the same time; it must have been
	// reserved for the largest of them unless they all have the same
	// shape (see model.ActivationScratch); nil: the model's own.
	Scratch *model.ActivationScratch
	// Split, when set, is the memory of split backwards this model shares
	// with the stage's other activation sets (see model.SplitPool); nil:
	// the model's own.
	Split *model.SplitPool
	// Stage, when set, restricts the model to one pipeline stage.
	Stage *StageSpec
	// LogitChunk bounds how many columns of this rank's vocabulary have
	// logits at once (the output projection is then recomputed in the
	// backward pass); 0 keeps them under about 64 MiB.
	LogitChunk int
	// External makes New allocate no parameter and gradient buffers: the
	// caller binds them with Bind or, unit by unit, BindUnit (FSDP does,
	// from its unit hooks; a pipeline binds every microbatch's model to
	// its stage's buffers).
	External bool
	// Checkpoint selects the activations recomputed in the backward pass
	// (zero value: none). A pipeline stage numbers its own layers from 0
	// for the selective "N" rule.
	Checkpoint ActivationCheckpoint
	// Precision is the parameters' compute dtype and the float8 linear
	// layers (zero value: float32). Under bfloat16 the caller binds the
	// bfloat16 rounding of the parameters (the engine's FSDP runtime
	// does); the model computes every linear layer's products in
	// bfloat16 (see linear.go).
	Precision model.Precision
}

func (p Plan) tp() int { return max(p.TP, 1) }
func (p Plan) cp() int { return max(p.CP, 1) }

// ParallelComm is what a tensor- and context-parallel model needs from
// its peers. Buffers are host float32 slices. The model does not know how
// ranks communicate; internal/parallel/tp implements it with comm groups
// on the mesh's "tp" and "cp" dimensions.
type ParallelComm interface {
	// AllGatherSeq concatenates every tp rank's send, in tp rank order,
	// into recv (len(recv) = tp × len(send)).
	AllGatherSeq(send, recv []float32) error
	// ReduceScatterSeq sums send over the tp ranks and stores this rank's
	// chunk (of len(send)/tp elements, in tp rank order) in recv.
	ReduceScatterSeq(send, recv []float32) error
	// AllReduceTP replaces x with its element-wise maximum (max set) or
	// sum over the tp ranks.
	AllReduceTP(x []float32, max bool) error
	// RingShiftAsync starts sending send to the next cp rank and
	// receiving the previous cp rank's send into recv (same length);
	// wait returns once both are done. Until then the caller leaves send
	// unchanged and does not read recv.
	RingShiftAsync(send, recv []float32) (wait func() error)
}

// StageSpec is the part of a model that one pipeline stage computes: the
// transformer layers [FirstLayer, FirstLayer+NumLayers) of the full
// model, preceded by the token embedding when Embedding is set and
// followed by the final norm, the output projection and the loss when
// Head is set.
type StageSpec struct {
	FirstLayer, NumLayers int
	Embedding, Head       bool
}

// whole is the stage spec of the whole model.
func whole(c Config) StageSpec {
	return StageSpec{FirstLayer: 0, NumLayers: c.NLayers, Embedding: true, Head: true}
}

// ShardKind says how tensor parallelism splits a parameter.
type ShardKind uint8

// Shard kinds.
const (
	// Replicated parameters (the norms) are whole on every tp rank.
	Replicated ShardKind = iota
	// RowBlock parameters [out, in] are split along out: tp rank r holds
	// the contiguous rows [r·out/tp, (r+1)·out/tp) (column-parallel
	// linears, the vocabulary-parallel embedding and output).
	RowBlock
	// ColBlock parameters [out, in] are split along in: tp rank r holds
	// columns [r·in/tp, (r+1)·in/tp) of every row (row-parallel linears).
	ColBlock
)

// ShardParam is one parameter of a rank's flat buffer.
type ShardParam struct {
	Param           // the whole (logical) parameter in Config.Layout
	Kind  ShardKind // how tensor parallelism splits it
	// LocalOffset and LocalSize place the rank's shard in its flat buffer.
	LocalOffset, LocalSize int
}

// ShardLayout returns the parameters of a tp rank's flat buffer in layout
// order (the same for every rank of the tp group).
func (c Config) ShardLayout(tp int) []ShardParam {
	return c.LocalLayout(tp, whole(c))
}

// LocalLayout returns the parameters of the flat buffer of a tp rank
// holding stage s: the stage's part of ShardLayout, a contiguous range,
// with LocalOffset counted from the stage's first element.
func (c Config) LocalLayout(tp int, s StageSpec) []ShardParam {
	var out []ShardParam
	off := 0
	for i, p := range c.Layout() {
		if !s.holds(c, i) {
			continue
		}
		sp := ShardParam{Param: p, Kind: shardKind(p), LocalSize: p.Size}
		if sp.Kind != Replicated {
			sp.LocalSize = p.Size / tp
		}
		sp.LocalOffset = off
		off += sp.LocalSize
		out = append(out, sp)
	}
	return out
}

// holds reports whether the stage holds parameter i of c's layout.
func (s StageSpec) holds(c Config, i int) bool {
	n := numParams(c)
	switch {
	case i == 0:
		return s.Embedding
	case i >= n-2:
		return s.Head
	}
	l := (i - 1) / paramsPerLayer
	return l >= s.FirstLayer && l < s.FirstLayer+s.NumLayers
}

// paramsPerLayer is the number of tensors of one transformer block.
const paramsPerLayer = 9

// numParams is len(c.Layout()) without building the layout: the
// embedding, every block's tensors, the final norm and the output.
func numParams(c Config) int { return 1 + paramsPerLayer*c.NLayers + 2 }

// Range returns the elements [lo, hi) of full's flat layout that the
// stage's parameters occupy: a contiguous range, since the layout orders
// the embedding, the layers and the head.
func (s StageSpec) Range(full Config) (lo, hi int) { return s.ShardRange(full, 1) }

// ShardRange returns the elements [lo, hi) of a tp rank's flat buffer
// (Config.ShardLayout of full) that the stage's parameters occupy.
func (s StageSpec) ShardRange(full Config, tp int) (lo, hi int) {
	all := full.ShardLayout(tp)
	lo, hi = -1, 0
	for i, p := range all {
		if s.holds(full, i) {
			if lo < 0 {
				lo = p.LocalOffset
			}
			hi = p.LocalOffset + p.LocalSize
		}
	}
	return max(lo, 0), hi
}

func shardKind(p Param) ShardKind {
	switch {
	case len(p.Shape) == 1:
		return Replicated
	case hasSuffix(p.Name, "attention.wo.weight"), hasSuffix(p.Name, "feed_forward.w2.weight"):
		return ColBlock
	}
	return RowBlock
}

func hasSuffix(s, suf string) bool { return len(s) >= len(suf) && s[len(s)-len(suf):] == suf }

// Unit is one unit of a rank's flat buffer that sharded data parallelism
// gathers and reduces as a whole: elements [Lo, Hi). The units of the
// whole model are the token embedding, each transformer layer, and the
// final norm with the output projection; a pipeline stage has those it
// holds, in the same order.
type Unit = model.Range

// LayoutUnits groups lay (a LocalLayout) into its units.
func LayoutUnits(lay []ShardParam) []Unit {
	var us []Unit
	for i := 0; i < len(lay); {
		n := unitTensors(lay, i)
		us = append(us, Unit{Lo: lay[i].LocalOffset, Hi: lay[i+n-1].LocalOffset + lay[i+n-1].LocalSize})
		i += n
	}
	return us
}

// unitTensors is the number of tensors of the unit starting at lay[i]:
// one for the embedding, two for the head, a block's otherwise.
func unitTensors(lay []ShardParam, i int) int {
	switch lay[i].Name {
	case "tok_embeddings.weight":
		return 1
	case "norm.weight":
		return 2
	}
	return paramsPerLayer
}

// Units returns the units of the whole model's flat layout in order;
// they tile the buffer.
func (c Config) Units() []Unit { return LayoutUnits(c.ShardLayout(1)) }

// bindUnit lays the views of the unit whose tensors start at lay[i] over
// buf, which holds the unit's elements, into p; layer is the local index
// of a block unit.
func bindUnit(p *Params, lay []ShardParam, i, layer int, buf backend.Tensor) {
	base := lay[i].LocalOffset
	t := func(j int) backend.Tensor { return buf.Slice(lay[i+j].LocalOffset-base, lay[i+j].LocalSize) }
	switch unitTensors(lay, i) {
	case 1:
		p.Embedding = t(0)
	case 2:
		p.Norm, p.Output = t(0), t(1)
	default:
		p.Layers[layer] = LayerParams{
			AttnNorm: t(0), Wq: t(1), Wk: t(2), Wv: t(3), Wo: t(4),
			FFNNorm: t(5), W1: t(6), W2: t(7), W3: t(8),
		}
	}
}

// View lays cfg's parameters over the whole model's flat buffer flat.
func View(cfg Config, flat backend.Tensor) Params {
	p := Params{Layers: make([]LayerParams, cfg.NLayers)}
	viewAll(&p, cfg.ShardLayout(1), flat)
	return p
}

// viewAll lays every unit's views of lay over flat into p.
func viewAll(p *Params, lay []ShardParam, flat backend.Tensor) {
	layer := 0
	for i := 0; i < len(lay); {
		n := unitTensors(lay, i)
		last := lay[i+n-1]
		bindUnit(p, lay, i, layer, flat.Slice(lay[i].LocalOffset, last.LocalOffset+last.LocalSize-lay[i].LocalOffset))
		if n == paramsPerLayer {
			layer++
		}
		i += n
	}
}

// CheckParallel reports why a model of shape c cannot train sequences of
// T tokens with tensor parallel degree tp and context parallel degree cp.
// The errors name the degree's key and the sequence's length; a caller
// checking another sequence than training's names its key
// (validation.seq_len).
func CheckParallel(c Config, T, tp, cp int) error {
	if tp < 1 || cp < 1 {
		return fmt.Errorf("parallelism: tensor_parallel_degree %d and context_parallel_degree %d must be positive", tp, cp)
	}
	for _, d := range []struct {
		what string
		n    int
	}{
		{"n_heads", c.NHeads}, {"n_kv_heads", c.KVHeads()}, {"FFN hidden size", c.FFNHidden()}, {"vocab_size", c.VocabSize},
	} {
		if d.n%tp != 0 {
			return fmt.Errorf("parallelism.tensor_parallel_degree %d: %s %d is not divisible by %d", tp, d.what, d.n, tp)
		}
	}
	if cp > 1 && T%(2*cp) != 0 {
		return fmt.Errorf("parallelism.context_parallel_degree %d: sequence length %d does not split into 2×%d = %d equal chunks (each rank holds a head and a tail chunk)", cp, T, cp, 2*cp)
	}
	if (T/cp)%tp != 0 {
		return fmt.Errorf("parallelism.tensor_parallel_degree %d: sequence length %d / context_parallel_degree %d = %d does not split into %d (sequence parallel)", tp, T, cp, T/cp, tp)
	}
	return nil
}

// ShardFlat extracts tp rank r's shards from the whole flat buffer full
// (Config.Layout order) into a new buffer in ShardLayout order.
func ShardFlat(c Config, tp, r int, full []float32) []float32 {
	lay := c.ShardLayout(tp)
	last := lay[len(lay)-1]
	out := make([]float32, last.LocalOffset+last.LocalSize)
	for _, p := range lay {
		ReadShard(p, tp, r, out[p.LocalOffset:p.LocalOffset+p.LocalSize], func(lo int, dst []float32) error {
			copy(dst, full[p.Offset+lo:])
			return nil
		})
	}
	return out
}

// ReadShard fills dst (p.LocalSize elements) with tp rank r's shard of
// parameter p, reading the whole parameter's elements [lo, lo+len(d))
// with read, in as few contiguous reads as the split allows.
func ReadShard(p ShardParam, tp, r int, dst []float32, read func(lo int, d []float32) error) error {
	switch p.Kind {
	case Replicated:
		return read(0, dst)
	case RowBlock:
		return read(r*p.LocalSize, dst)
	}
	in := p.Shape[1]
	w := in / tp
	for i := 0; i < p.Shape[0]; i++ {
		if err := read(i*in+r*w, dst[i*w:(i+1)*w]); err != nil {
			return err
		}
	}
	return nil
}

// UnshardFlat is the inverse of ShardFlat: it assembles the whole flat
// buffer from every tp rank's shards (locals[r] from rank r; replicated
// parameters are taken from rank 0).
func UnshardFlat(c Config, locals [][]float32) []float32 {
	tp := len(locals)
	full := make([]float32, c.NumParams())
	for _, p := range c.ShardLayout(tp) {
		dst := full[p.Offset : p.Offset+p.Size]
		for r, loc := range locals {
			src := loc[p.LocalOffset : p.LocalOffset+p.LocalSize]
			switch p.Kind {
			case Replicated:
				if r == 0 {
					copy(dst, src)
				}
			case RowBlock:
				copy(dst[r*p.LocalSize:], src)
			case ColBlock:
				in := p.Shape[1]
				w := in / tp
				for i := 0; i < p.Shape[0]; i++ {
					copy(dst[i*in+r*w:i*in+(r+1)*w], src[i*w:])
				}
			}
		}
	}
	return full
}

// ChunkStart is the position of the first token of local chunk half
// (0: head, 1: tail) on context-parallel rank r of cp, for sequences of T
// tokens split into 2·cp chunks: rank r holds chunks r and 2cp-1-r.
func ChunkStart(T, cp, r, half int) int {
	c := T / (2 * cp)
	if half == 0 {
		return r * c
	}
	return (2*cp - 1 - r) * c
}

// CPSlice copies context-parallel rank r's tokens of every row of x
// (rows of T tokens) into a new slice: per row the head chunk then the
// tail chunk. With cp = 1 it returns x.
func CPSlice(x []int32, T, cp, r int) []int32 {
	if cp == 1 {
		return x
	}
	c := T / (2 * cp)
	rows := len(x) / T
	out := make([]int32, 0, rows*2*c)
	for b := 0; b < rows; b++ {
		for h := 0; h < 2; h++ {
			s := b*T + ChunkStart(T, cp, r, h)
			out = append(out, x[s:s+c]...)
		}
	}
	return out
}
