//go:build cgo

package cuda

import (
	"context"
	"fmt"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/cudart"
)

// NCCLGroup is an NCCL communicator over the device memory of one
// mesh group (the world, a data-parallel or tensor-parallel group). Its
// collectives run on a stream of their own, ordered after the compute
// stream's queued work by an event and before the compute stream's later
// work by another, so communication overlaps compute issued in between.
//
// UNTESTED: written against nccl.h and compiled; no GPU has run it yet.
type NCCLGroup struct {
	b          *Backend
	g          *gpu
	lib        *cudart.NCCL
	comm       cudart.Comm
	stream     cudart.Stream
	ready      cudart.Event // compute → comm
	done       cudart.Event // comm → compute
	name       string
	rank, size int
}

// NewNCCLGroup joins the communicator name of size ranks: group rank 0
// creates the NCCL unique id and publishes it in store (the control
// plane's key-value store) under "nccl/<name>/id"; the others read it
// there. Every member calls it with the same name and size.
func NewNCCLGroup(ctx context.Context, b *Backend, store comm.Store, name string, rank, size int) (*NCCLGroup, error) {
	g, ok := b.dev.(*gpu)
	if !ok {
		return nil, fmt.Errorf("nccl group %s: the backend runs on %s, not a GPU", name, b.dev.Name())
	}
	lib, err := cudart.LoadNCCL()
	if err != nil {
		return nil, err
	}
	key := "nccl/" + name + "/id"
	var id []byte
	if rank == 0 {
		if id, err = lib.UniqueID(); err != nil {
			return nil, err
		}
		if err := store.Set(ctx, key, id); err != nil {
			return nil, fmt.Errorf("nccl group %s: publishing the unique id: %w", name, err)
		}
	} else if id, err = store.Get(ctx, key); err != nil {
		return nil, fmt.Errorf("nccl group %s: rank %d waiting for the unique id: %w", name, rank, err)
	}
	defer g.bind()()
	n := &NCCLGroup{b: b, g: g, lib: lib, name: name, rank: rank, size: size}
	if n.stream, err = g.drv.StreamCreate(); err != nil {
		return nil, err
	}
	if n.ready, err = g.drv.EventCreate(false); err != nil {
		return nil, err
	}
	if n.done, err = g.drv.EventCreate(false); err != nil {
		return nil, err
	}
	if n.comm, err = lib.InitRank(size, rank, id); err != nil {
		return nil, fmt.Errorf("nccl group %s rank %d of %d: %w", name, rank, size, err)
	}
	return n, nil
}

func ncclType(op string, dt backend.DType) (int, error) {
	switch dt {
	case backend.Float32:
		return cudart.NCCLFloat32, nil
	case backend.BFloat16:
		return cudart.NCCLBFloat16, nil
	case backend.Int32:
		return cudart.NCCLInt32, nil
	}
	return 0, fmt.Errorf("nccl %s: dtype %s", op, dt)
}

// run orders fn (queued on the group's stream) between the compute
// stream's earlier and later work.
func (n *NCCLGroup) run(fn func() error) error {
	defer n.g.bind()()
	d := n.g.drv
	if err := d.EventRecord(n.ready, n.g.stream); err != nil {
		return err
	}
	if err := d.StreamWaitEvent(n.stream, n.ready); err != nil {
		return err
	}
	if err := fn(); err != nil {
		return err
	}
	if err := d.EventRecord(n.done, n.stream); err != nil {
		return err
	}
	return d.StreamWaitEvent(n.g.stream, n.done)
}

func ncclOp(avg bool) int {
	if avg {
		return cudart.NCCLAvg
	}
	return cudart.NCCLSum
}

// AllReduce sums (or averages) t over the group, in place.
func (n *NCCLGroup) AllReduce(t backend.Tensor, avg bool) error {
	dt, err := ncclType("AllReduce", t.DType())
	if err != nil {
		return err
	}
	p := cudart.DevPtr(ptr("AllReduce", "t", t, t.DType(), t.Len))
	return n.run(func() error { return n.lib.AllReduce(p, p, t.Len, dt, ncclOp(avg), n.comm, n.stream) })
}

// ReduceScatter reduces send (size × len(recv) elements) and leaves this
// rank's chunk in recv.
func (n *NCCLGroup) ReduceScatter(send, recv backend.Tensor, avg bool) error {
	if send.Len != recv.Len*n.size {
		return fmt.Errorf("nccl ReduceScatter on %s: send has %d elements, want %d × %d", n.name, send.Len, n.size, recv.Len)
	}
	dt, err := ncclType("ReduceScatter", send.DType())
	if err != nil {
		return err
	}
	s, r := cudart.DevPtr(ptr("ReduceScatter", "send", send, send.DType(), send.Len)), cudart.DevPtr(ptr("ReduceScatter", "recv", recv, send.DType(), recv.Len))
	return n.run(func() error { return n.lib.ReduceScatter(s, r, recv.Len, dt, ncclOp(avg), n.comm, n.stream) })
}

// AllGather gathers every rank's send into recv (size × len(send)).
func (n *NCCLGroup) AllGather(send, recv backend.Tensor) error {
	if recv.Len != send.Len*n.size {
		return fmt.Errorf("nccl AllGather on %s: recv has %d elements, want %d × %d", n.name, recv.Len, n.size, send.Len)
	}
	dt, err := ncclType("AllGather", send.DType())
	if err != nil {
		return err
	}
	s, r := cudart.DevPtr(ptr("AllGather", "send", send, send.DType(), send.Len)), cudart.DevPtr(ptr("AllGather", "recv", recv, send.DType(), recv.Len))
	return n.run(func() error { return n.lib.AllGather(s, r, send.Len, dt, n.comm, n.stream) })
}

// Broadcast copies t of group rank root to every rank.
func (n *NCCLGroup) Broadcast(t backend.Tensor, root int) error {
	dt, err := ncclType("Broadcast", t.DType())
	if err != nil {
		return err
	}
	p := cudart.DevPtr(ptr("Broadcast", "t", t, t.DType(), t.Len))
	return n.run(func() error { return n.lib.Broadcast(p, p, t.Len, dt, root, n.comm, n.stream) })
}

// Wait blocks until the group's queued collectives finished and reports
// an asynchronous NCCL error.
func (n *NCCLGroup) Wait() error {
	defer n.g.bind()()
	if err := n.g.drv.StreamSynchronize(n.stream); err != nil {
		return err
	}
	return n.lib.AsyncError(n.comm)
}

// Close destroys the communicator and its stream.
func (n *NCCLGroup) Close() error {
	defer n.g.bind()()
	err := n.lib.Destroy(n.comm)
	n.g.drv.EventDestroy(n.ready)
	n.g.drv.EventDestroy(n.done)
	n.g.drv.StreamDestroy(n.stream)
	return err
}
