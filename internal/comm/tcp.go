package comm

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// The TCP transport connects every pair of members directly (a full mesh:
// a data, a point-to-point and a control connection per pair).
//
// Reductions are direct reduce-scatters: chunk j of every rank's buffer is
// sent, unreduced, to rank j, which folds the n contributions in rank order
// (so the wire carries raw elements, bfloat16 stays 2 bytes, and the
// result does not depend on chunking or transport), pipelined in
// SegmentBytes pieces so that folding overlaps the transfer. An all-reduce
// then sends every reduced chunk from its owner to all ranks. Each rank
// sends and receives (n-1)/n of the buffer per phase, the same volume as a
// ring, in one step instead of n-1. Broadcast is a pipelined chain
// root → root+1 → ... in group rank order.

type tcpOp struct {
	g *group
	r *request

	abort    chan struct{}
	mu       sync.Mutex
	err      error
	finished bool
	timedOut atomic.Bool
	entered  []atomic.Bool
	recvDone []atomic.Bool
	sendDone []atomic.Bool
	wg       sync.WaitGroup
	timer    *time.Timer
}

var errDeadline = fmt.Errorf("deadline exceeded: %w", ErrTimeout)

func (g *group) tcpRun(r *request, deadline time.Time) error {
	o := &tcpOp{
		g: g, r: r,
		abort:    make(chan struct{}),
		entered:  make([]atomic.Bool, g.size),
		recvDone: make([]atomic.Bool, g.size),
		sendDone: make([]atomic.Bool, g.size),
	}
	for _, p := range g.peers {
		if p != nil {
			p.data.SetDeadline(deadline)
		}
	}
	o.timer = time.AfterFunc(time.Until(deadline), func() {
		o.timedOut.Store(true)
		o.fail(errDeadline)
	})
	n, me := g.size, g.rank
	switch r.kind {
	case opBarrier:
		for q := range n {
			if q != me {
				o.goSend(q, nil)
				o.goRecv(q, nil)
			}
		}
	case opAllReduce:
		lo, hi := ChunkBounds(r.a.n, n, me)
		o.reduce(r.a, r.a.Slice(lo, hi), true)
	case opReduceScatter:
		o.reduce(r.a, r.b, false)
	case opAllGather:
		o.allGather()
	case opBroadcast:
		o.broadcast()
	case opAllToAll:
		o.allToAll()
	default:
		o.fail(fmt.Errorf("unknown operation %v", r.kind))
	}
	return o.finish()
}

func (o *tcpOp) fail(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err != nil || o.finished {
		return
	}
	o.err = err
	close(o.abort)
	past := time.Unix(1, 0)
	for _, p := range o.g.peers {
		if p != nil {
			p.data.SetDeadline(past)
		}
	}
}

func (o *tcpOp) connFail(q int, err error) {
	if err == errOpAborted {
		return
	}
	o.mu.Lock()
	first := o.err == nil && !o.finished
	o.mu.Unlock()
	if !first {
		// A consequence of the first failure (fail expires every
		// connection's deadline to unblock the other goroutines).
		return
	}
	if isTimeout(err) {
		o.timedOut.Store(true)
	}
	o.fail(&connFailure{peer: q, err: err})
}

func (o *tcpOp) finish() error {
	o.wg.Wait()
	o.timer.Stop()
	o.mu.Lock()
	o.finished = true
	err := o.err
	o.mu.Unlock()
	if err == nil {
		return nil
	}
	if o.timedOut.Load() {
		return o.blame()
	}
	return err
}

// blame names the peers a timed-out operation was waiting for: those whose
// header never arrived (they never entered the operation) or, when all
// entered, those whose data did not arrive or were not receiving.
func (o *tcpOp) blame() error {
	g := o.g
	var waiting, notEntered []int
	for q := range g.size {
		if q != g.rank && !o.entered[q].Load() {
			notEntered = append(notEntered, g.world[q])
		}
	}
	waiting = notEntered
	if len(waiting) == 0 {
		for q := range g.size {
			if q != g.rank && !(o.recvDone[q].Load() && o.sendDone[q].Load()) {
				waiting = append(waiting, g.world[q])
			}
		}
	}
	return &waitErr{waiting: waiting, notEntered: notEntered, op: o.r.kind.String(), seq: o.r.seq}
}

// header is the operation's header toward peer q (sending) or expected
// from it: an all-to-all carries the pair's share.
func (o *tcpOp) header(q int, sending bool) opHeader {
	r := o.r
	h := r.header()
	if r.kind == opAllToAll { // each pair's share
		if sending {
			h.count = int64(r.sendCounts[q])
		} else {
			h.count = int64(r.recvCounts[q])
		}
	}
	return h
}

// goSend writes the operation header to peer q, then runs body.
func (o *tcpOp) goSend(q int, body func(c net.Conn) error) {
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		c := o.g.peers[q].data
		var hb [hdrSize]byte
		o.header(q, true).marshal(hb[:])
		if _, err := c.Write(hb[:]); err != nil {
			o.connFail(q, err)
			return
		}
		if body != nil {
			if err := body(c); err != nil {
				o.connFail(q, err)
				return
			}
		}
		o.sendDone[q].Store(true)
	}()
}

// goRecv reads and checks the operation header from peer q, then runs body.
func (o *tcpOp) goRecv(q int, body func(c net.Conn) error) {
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		c := o.g.peers[q].data
		var hb [hdrSize]byte
		if _, err := io.ReadFull(c, hb[:]); err != nil {
			o.connFail(q, err)
			return
		}
		h, err := unmarshalHeader(hb[:])
		if err == nil {
			err = o.check(q, h)
		}
		if err != nil {
			o.fail(err)
			return
		}
		o.entered[q].Store(true)
		if body != nil {
			if err := body(c); err != nil {
				o.connFail(q, err)
				return
			}
		}
		o.recvDone[q].Store(true)
	}()
}

func (o *tcpOp) check(q int, h opHeader) error {
	want := o.header(q, false)
	if h == want {
		return nil
	}
	peer := o.g.world[q]
	if h.kind == opAllToAll && want.kind == opAllToAll && h.seq == want.seq && h.dtype == want.dtype {
		return fmt.Errorf("rank %d sends %d elements to this rank, which expects %d", peer, h.count, want.count)
	}
	return fmt.Errorf("rank %d issued %v while this rank issued %v", peer, h, want)
}

func write(c net.Conn, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	_, err := c.Write(b)
	return err
}

func readFull(c net.Conn, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	_, err := io.ReadFull(c, b)
	return err
}

const segDepth = 4

// segments returns the reduction scratch buffers for peer q.
func (g *group) segments(q int) [][]byte {
	if g.scratch[q] == nil {
		for range segDepth {
			g.scratch[q] = append(g.scratch[q], make([]byte, g.segBytes))
		}
	}
	return g.scratch[q]
}

// reduce reduce-scatters send into out (this rank's chunk) and, if gather,
// then sends out to every peer and receives their chunks into send.
func (o *tcpOp) reduce(send, out Buffer, gather bool) {
	g := o.g
	n, me := g.size, g.rank
	N, dt, op := send.n, send.dtype, o.r.op
	es := dt.Size()
	lo, hi := ChunkBounds(N, n, me)
	mine := hi - lo
	segE := g.segBytes / es
	segs := (mine + segE - 1) / segE
	segRange := func(s int) (int, int) { return s * segE, min((s+1)*segE, mine) }

	ready := make([]chan []byte, n)
	free := make([]chan []byte, n)
	agReady := make([]chan struct{}, n)
	for q := range n {
		if q == me {
			continue
		}
		ready[q] = make(chan []byte, segDepth)
		free[q] = make(chan []byte, segDepth)
		for _, b := range g.segments(q) {
			free[q] <- b
		}
		agReady[q] = make(chan struct{}, segs)
		rsSent := make(chan struct{})
		qlo, qhi := ChunkBounds(N, n, q)
		o.goSend(q, func(c net.Conn) error {
			if err := write(c, send.bytes(qlo, qhi)); err != nil {
				return err
			}
			close(rsSent)
			if !gather {
				return nil
			}
			for s := range segs {
				select {
				case <-agReady[q]:
				case <-o.abort:
					return errOpAborted
				}
				if err := write(c, out.bytes(segRange(s))); err != nil {
					return err
				}
			}
			return nil
		})
		o.goRecv(q, func(c net.Conn) error {
			for s := range segs {
				var b []byte
				select {
				case b = <-free[q]:
				case <-o.abort:
					return errOpAborted
				}
				slo, shi := segRange(s)
				if err := readFull(c, b[:(shi-slo)*es]); err != nil {
					return err
				}
				ready[q] <- b
			}
			if !gather {
				return nil
			}
			// The owner of chunk q sends it back reduced only after it
			// received all of ours; wait for our write to return before
			// overwriting the memory it reads.
			select {
			case <-rsSent:
			case <-o.abort:
				return errOpAborted
			}
			return readFull(c, send.bytes(qlo, qhi))
		})
	}
	srcs := make([][]byte, n)
	for s := range segs {
		slo, shi := segRange(s)
		for q := range n {
			if q == me {
				srcs[q] = send.bytes(lo+slo, lo+shi)
				continue
			}
			select {
			case b := <-ready[q]:
				srcs[q] = b[:(shi-slo)*es]
			case <-o.abort:
				return
			}
		}
		fold(dt, op, out.bytes(slo, shi), srcs)
		for q := range n {
			if q == me {
				continue
			}
			free[q] <- srcs[q][:cap(srcs[q])]
			if gather {
				agReady[q] <- struct{}{}
			}
		}
	}
}

func (o *tcpOp) allGather() {
	g, r := o.g, o.r
	n, me := g.size, g.rank
	send, recv := r.a, r.b
	lo, hi := ChunkBounds(recv.n, n, me)
	if dst := recv.bytes(lo, hi); len(dst) > 0 && unsafePointer(dst) != unsafePointer(send.b) {
		copy(dst, send.b)
	}
	for q := range n {
		if q == me {
			continue
		}
		qlo, qhi := ChunkBounds(recv.n, n, q)
		o.goSend(q, func(c net.Conn) error { return write(c, send.b) })
		o.goRecv(q, func(c net.Conn) error { return readFull(c, recv.bytes(qlo, qhi)) })
	}
}

func (o *tcpOp) broadcast() {
	g, r := o.g, o.r
	n, me := g.size, g.rank
	buf := r.a
	pos := (me - r.root + n) % n
	prev, next := (me-1+n)%n, (me+1)%n
	segE := g.segBytes / buf.dtype.Size()
	segs := (buf.n + segE - 1) / segE
	fwd := make(chan int, segs)
	for q := range n {
		if q == me {
			continue
		}
		var sendBody, recvBody func(net.Conn) error
		if q == next && pos < n-1 {
			sendBody = func(c net.Conn) error {
				if pos == 0 {
					return write(c, buf.b)
				}
				for range segs {
					var s int
					select {
					case s = <-fwd:
					case <-o.abort:
						return errOpAborted
					}
					if err := write(c, buf.bytes(s*segE, min((s+1)*segE, buf.n))); err != nil {
						return err
					}
				}
				return nil
			}
		}
		if q == prev && pos > 0 {
			recvBody = func(c net.Conn) error {
				for s := range segs {
					if err := readFull(c, buf.bytes(s*segE, min((s+1)*segE, buf.n))); err != nil {
						return err
					}
					if pos < n-1 {
						fwd <- s
					}
				}
				return nil
			}
		}
		o.goSend(q, sendBody)
		o.goRecv(q, recvBody)
	}
}

func (o *tcpOp) allToAll() {
	g, r := o.g, o.r
	n, me := g.size, g.rank
	send, recv := r.a, r.b
	copy(recv.bytes(r.recvOff[me], r.recvOff[me+1]), send.bytes(r.sendOff[me], r.sendOff[me+1]))
	for q := range n {
		if q == me {
			continue
		}
		o.goSend(q, func(c net.Conn) error { return write(c, send.bytes(r.sendOff[q], r.sendOff[q+1])) })
		o.goRecv(q, func(c net.Conn) error { return readFull(c, recv.bytes(r.recvOff[q], r.recvOff[q+1])) })
	}
}

// submitP2P queues a Send or Recv on the per-peer, per-direction queue.
func (g *group) submitP2P(r *request) {
	g.p2pMu.Lock()
	defer g.p2pMu.Unlock()
	g.mu.Lock()
	closed := g.closed
	g.mu.Unlock()
	if closed {
		r.work.finish(fmt.Errorf("comm: %s on group %s: %w", r.kind, g.name, ErrClosed))
		return
	}
	if g.sendSeq == nil {
		g.sendSeq, g.recvSeq = make([]uint64, g.size), make([]uint64, g.size)
		g.sendQ, g.recvQ = make([]chan *request, g.size), make([]chan *request, g.size)
	}
	seqs, queues := g.sendSeq, g.sendQ
	if r.kind == opRecv {
		seqs, queues = g.recvSeq, g.recvQ
	}
	seqs[r.peer]++
	r.seq = seqs[r.peer]
	if queues[r.peer] == nil {
		ch := make(chan *request, 1024)
		queues[r.peer] = ch
		g.p2pWG.Add(1)
		go func() {
			defer g.p2pWG.Done()
			for r := range ch {
				g.execute(r)
			}
		}()
	}
	r.rec = g.hub.flight.add(g, r)
	ctx := r.ctx
	r.stopCtx = context.AfterFunc(ctx, func() {
		g.abort(fmt.Errorf("%s #%d to/from rank %d cancelled: %w", r.kind, r.seq, g.world[r.peer], context.Cause(ctx)))
	})
	queues[r.peer] <- r
}

// runP2P performs a Send or Recv on the point-to-point connection.
func (g *group) runP2P(r *request, deadline time.Time) error {
	p := g.peers[r.peer]
	c := p.p2p
	h := opHeader{kind: opSend, dtype: r.dtype, seq: r.seq, count: int64(r.a.n)}
	var hb [hdrSize]byte
	waiting := func(entered bool) error {
		w := &waitErr{waiting: []int{p.world}, op: r.kind.String(), seq: r.seq}
		if !entered {
			w.notEntered = w.waiting
			w.op = "the matching recv"
			if r.kind == opRecv {
				w.op = "the matching send"
			}
		}
		return w
	}
	if r.kind == opSend {
		c.SetWriteDeadline(deadline)
		h.marshal(hb[:])
		bufs := net.Buffers{hb[:], r.a.b}
		if _, err := bufs.WriteTo(c); err != nil {
			if isTimeout(err) {
				return waiting(true)
			}
			return &connFailure{peer: r.peer, err: err}
		}
		return nil
	}
	c.SetReadDeadline(deadline)
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		if isTimeout(err) {
			return waiting(false)
		}
		return &connFailure{peer: r.peer, err: err}
	}
	got, err := unmarshalHeader(hb[:])
	if err != nil {
		return err
	}
	if got != h {
		return fmt.Errorf("rank %d sent %s #%d of %d %s elements, this rank receives #%d of %d %s elements",
			p.world, got.kind, got.seq, got.count, got.dtype, h.seq, h.count, h.dtype)
	}
	if err := readFull(c, r.a.b); err != nil {
		if isTimeout(err) {
			return waiting(true)
		}
		return &connFailure{peer: r.peer, err: err}
	}
	return nil
}
