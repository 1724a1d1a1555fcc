package llama

import (
	"errors"
	"fmt"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/model"
)

// RingAttentionProbe returns one layer's ring attention, forward and
// backward, as context-parallel rank 0 of cp runs it for batches of B
// rows of T tokens: every block's attention, the merges of the partial
// results and the staging of the rotating key/value blocks (and their
// gradients) through host memory — the model's own code (attention and
// attentionBackward), with the rotations handing the rank its own
// blocks back instead of communicating. titan plan --calibrate times it:
// the ring's many small blocks run well below the rate of one attention
// over whole rows. The values computed are meaningless; the work is the
// ring's.
func RingAttentionProbe(be backend.Backend, cfg Config, B, T, cp int, prec model.Precision) (fwd, bwd func() error, err error) {
	if cp < 2 {
		return nil, nil, fmt.Errorf("llama: ring attention probe: cp %d, want at least 2", cp)
	}
	m, err := New(be, cfg, B, T, Plan{CP: cp, Comm: loopback{}, Precision: prec})
	if err != nil {
		return nil, nil, err
	}
	a := &m.layers[0]
	return func() error { return m.attention(a) }, func() error { return m.attentionBackward(a, m.dv) }, nil
}

// loopback is RingAttentionProbe's ParallelComm: a ring shift returns
// what was sent; it has no tensor-parallel peers.
type loopback struct{}

var errLoopback = errors.New("llama: ring attention probe has no tensor-parallel peers")

func (loopback) AllGatherSeq(send, recv []float32) error     { return errLoopback }
func (loopback) ReduceScatterSeq(send, recv []float32) error { return errLoopback }
func (loopback) AllReduceTP(x []float32, max bool) error     { return errLoopback }
func (loopback) RingShiftAsync(send, recv []float32) func() error {
	copy(recv, send)
	return func() error { return nil }
}
