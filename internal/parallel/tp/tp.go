// Package tp connects the tensor- and context-parallel model
// (a llama.Model with tp or cp > 1) to its peers: Comm implements llama.ParallelComm with
// comm groups on the mesh's "tp" and "cp" dimensions.
package tp

import (
	"context"
	"fmt"

	"github.com/titan-go/titan/internal/comm"
)

// Comm implements llama.ParallelComm over a tensor-parallel group TP and
// a context-parallel group CP (either nil when its degree is 1).
type Comm struct {
	TP, CP comm.Group
	// Ctx is the context of every operation (nil: context.Background()).
	Ctx context.Context
}

func (c *Comm) ctx() context.Context {
	if c.Ctx == nil {
		return context.Background()
	}
	return c.Ctx
}

// AllGatherSeq concatenates every tp rank's send into recv, in rank order.
func (c *Comm) AllGatherSeq(send, recv []float32) error {
	if c.TP == nil {
		copy(recv, send)
		return nil
	}
	if len(recv) != len(send)*c.TP.Size() {
		return fmt.Errorf("tp: all-gather of %d elements into %d over %d ranks", len(send), len(recv), c.TP.Size())
	}
	return c.TP.AllGather(c.ctx(), comm.F32(send), comm.F32(recv))
}

// ReduceScatterSeq sums send over the tp ranks and keeps this rank's
// chunk in recv.
func (c *Comm) ReduceScatterSeq(send, recv []float32) error {
	if c.TP == nil {
		copy(recv, send)
		return nil
	}
	if len(send) != len(recv)*c.TP.Size() {
		return fmt.Errorf("tp: reduce-scatter of %d elements into %d over %d ranks", len(send), len(recv), c.TP.Size())
	}
	return c.TP.ReduceScatter(c.ctx(), comm.F32(send), comm.F32(recv), comm.Sum)
}

// AllReduceTP replaces x with its maximum (isMax) or sum over the tp ranks.
func (c *Comm) AllReduceTP(x []float32, isMax bool) error {
	if c.TP == nil {
		return nil
	}
	op := comm.Sum
	if isMax {
		op = comm.Max
	}
	return c.TP.AllReduce(c.ctx(), comm.F32(x), op)
}

// RingShiftAsync starts sending send to the next cp rank and receiving
// the previous one's into recv; wait returns once both are done.
func (c *Comm) RingShiftAsync(send, recv []float32) (wait func() error) {
	if c.CP == nil {
		copy(recv, send)
		return func() error { return nil }
	}
	n, r := c.CP.Size(), c.CP.Rank()
	sw := c.CP.SendAsync(c.ctx(), comm.F32(send), (r+1)%n)
	rw := c.CP.RecvAsync(c.ctx(), comm.F32(recv), (r-1+n)%n)
	return func() error {
		errS, errR := sw.Wait(), rw.Wait()
		if errS != nil {
			return fmt.Errorf("tp: ring send: %w", errS)
		}
		if errR != nil {
			return fmt.Errorf("tp: ring receive: %w", errR)
		}
		return nil
	}
}
