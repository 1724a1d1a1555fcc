package comm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Group is a set of ranks that run collectives together. Every member must
// issue the same collectives on a group in the same order (point-to-point
// operations are matched per pair of ranks, in issue order). Operations run
// one at a time, in issue order, on a goroutine of the group; the Async
// variants return at once with a *Work, so communication overlaps compute.
//
// Ranks passed to and returned by methods (Rank, root, peer) are group
// ranks, 0..Size()-1; Ranks maps them to world ranks. Error messages name
// world ranks.
//
// Once an operation fails (timeout, dead peer, cancelled context, mismatch
// between ranks) the group is aborted: its peers are told, and every later
// operation fails at once with an error wrapping the first failure.
type Group interface {
	// Rank is this process's rank in the group.
	Rank() int
	// Size is the number of members.
	Size() int
	// Name is the name the group was created with ("world" for the world).
	Name() string
	// Ranks returns the world ranks of the members, in group rank order.
	Ranks() []int
	// Transport is "tcp", "shm" or "local" (a group of one).
	Transport() string

	// AllReduce replaces buf, on every rank, with the element-wise
	// reduction of all ranks' buf. The reduction folds contributions in
	// group rank order (see ReduceOp), so every rank gets bitwise the same
	// result, whatever the transport, size or run.
	AllReduce(ctx context.Context, buf Buffer, op ReduceOp) error
	AllReduceAsync(ctx context.Context, buf Buffer, op ReduceOp) *Work
	// ReduceScatter reduces the n elements of send across ranks (like
	// AllReduce) and stores in recv only this rank's chunk,
	// ChunkBounds(n, Size(), Rank()). recv may be exactly that chunk of
	// send; it must not otherwise overlap send.
	ReduceScatter(ctx context.Context, send, recv Buffer, op ReduceOp) error
	ReduceScatterAsync(ctx context.Context, send, recv Buffer, op ReduceOp) *Work
	// AllGather gathers every rank's send into recv, rank i's send landing
	// in chunk ChunkBounds(len(recv), Size(), i); send must have exactly
	// that chunk's length. send may be this rank's chunk of recv.
	AllGather(ctx context.Context, send, recv Buffer) error
	AllGatherAsync(ctx context.Context, send, recv Buffer) *Work
	// Broadcast copies buf of group rank root into buf of every rank.
	Broadcast(ctx context.Context, buf Buffer, root int) error
	BroadcastAsync(ctx context.Context, buf Buffer, root int) *Work
	// AllToAll sends chunk j of send to rank j and receives rank i's chunk
	// into chunk i of recv. With nil counts the chunks are
	// ChunkBounds(len, Size(), j), which match between ranks when every
	// rank's send and recv have the same length, divisible by Size().
	// Otherwise sendCounts[j] elements go to rank j and recvCounts[i] come
	// from rank i, chunks laid out in rank order; every rank's counts must
	// agree with its peers' (a mismatch fails the operation on all of
	// them). send and recv must not overlap.
	AllToAll(ctx context.Context, send, recv Buffer, sendCounts, recvCounts []int) error
	AllToAllAsync(ctx context.Context, send, recv Buffer, sendCounts, recvCounts []int) *Work
	// Send sends buf to group rank peer, which must Recv a buffer of the
	// same type and length. Sends to and receives from a peer are matched
	// in issue order; they run independently of collectives and of other
	// peers' traffic.
	Send(ctx context.Context, buf Buffer, peer int) error
	SendAsync(ctx context.Context, buf Buffer, peer int) *Work
	// Recv receives into buf what group rank peer sent.
	Recv(ctx context.Context, buf Buffer, peer int) error
	RecvAsync(ctx context.Context, buf Buffer, peer int) *Work
	// Barrier returns once every member entered it.
	Barrier(ctx context.Context) error
	BarrierAsync(ctx context.Context) *Work

	// NewGroup creates the sub-group of the given group ranks (in that
	// order: the new group's rank i is ranks[i]). Every member of the
	// sub-group must call it with the same ranks and name; other ranks
	// need not. The sub-group has its own connections or shared memory.
	NewGroup(ctx context.Context, ranks []int, name string) (Group, error)
	// Close waits for issued operations to finish, tells the peers and
	// releases connections and shared memory. Closing the world group
	// closes its sub-groups too.
	Close() error
}

// NewGroup creates a sub-group of parent; see Group.NewGroup.
func NewGroup(ctx context.Context, parent Group, ranks []int, name string) (Group, error) {
	return parent.NewGroup(ctx, ranks, name)
}

// Work is the handle of an asynchronous operation.
type Work struct {
	done  chan struct{}
	err   error
	kind  opKind // for the trace's wait spans
	bytes int64  // counted in InFlightBytes until finished
}

func newWork() *Work { return &Work{done: make(chan struct{})} }

func (w *Work) finish(err error) {
	w.err = err
	if w.bytes != 0 {
		inFlight.Add(-w.bytes)
	}
	close(w.done)
}

// Wait blocks until the operation completed and returns its error. The
// operation's buffers may be used again once Wait returned. The time it
// blocks counts in BlockedTime.
func (w *Work) Wait() error { return w.waitBlocked() }

// Done is closed when the operation completed.
func (w *Work) Done() <-chan struct{} { return w.done }

type opKind uint8

const (
	opBarrier opKind = iota + 1
	opAllReduce
	opReduceScatter
	opAllGather
	opBroadcast
	opAllToAll
	opSend
	opRecv
)

var opNames = [...]string{"op0", "barrier", "allreduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "send", "recv"}

func (k opKind) String() string {
	if int(k) < len(opNames) {
		return opNames[k]
	}
	return fmt.Sprintf("op%d", int(k))
}

type request struct {
	kind       opKind
	started    time.Time // when it began executing (the trace's span)
	seq        uint64
	dtype      DType
	op         ReduceOp
	a, b       Buffer // input (or in-place) and output
	root       int
	peer       int
	sendCounts []int
	recvCounts []int
	sendOff    []int
	recvOff    []int
	ctx        context.Context
	stopCtx    func() bool
	work       *Work
	rec        uint64 // flight recorder id
}

func (r *request) count() int {
	switch r.kind {
	case opAllGather:
		return r.b.n
	case opBarrier:
		return 0
	}
	return r.a.n
}

// header is the operation's header as every rank must agree on it: kind,
// dtype, sequence number, element count, and the reduction or root where
// the kind has one. An all-to-all's count is its transport's to set (zero
// here): each pair's share, or none.
func (r *request) header() opHeader {
	h := opHeader{kind: r.kind, dtype: r.dtype, seq: r.seq, count: int64(r.count())}
	switch r.kind {
	case opAllReduce, opReduceScatter:
		h.op = r.op
	case opBroadcast:
		h.root = int64(r.root)
	case opAllToAll:
		h.count = 0
	case opBarrier:
		h.dtype = 0
	}
	return h
}

// Peer states.
const (
	peerAlive = iota
	peerDead
	peerAborted
	peerBye
)

type peer struct {
	rank   int // group rank
	world  int
	ctrl   net.Conn
	ctrlMu sync.Mutex
	data   net.Conn
	p2p    net.Conn

	state  atomic.Int32
	reason string // set before state leaves peerAlive
	gone   chan struct{}
	once   sync.Once
}

func (p *peer) setGone(state int32, reason string) {
	p.once.Do(func() {
		p.reason = reason
		p.state.Store(state)
		close(p.gone)
	})
}

func (p *peer) goneErr() error {
	select {
	case <-p.gone:
		return &peerErr{rank: p.world, kind: int(p.state.Load()), reason: p.reason}
	default:
		return nil
	}
}

func (p *peer) closeConns() {
	for _, c := range []net.Conn{p.ctrl, p.data, p.p2p} {
		if c != nil {
			c.Close()
		}
	}
}

func (p *peer) sendCtrl(typ byte, payload []byte) error {
	p.ctrlMu.Lock()
	defer p.ctrlMu.Unlock()
	p.ctrl.SetWriteDeadline(time.Now().Add(time.Second))
	return writeMsg(p.ctrl, typ, payload)
}

type group struct {
	hub       *hub
	key       string
	name      string
	rank      int
	size      int
	world     []int
	opts      Options
	transport string
	peers     []*peer // by group rank; nil at this rank
	segBytes  int

	mu      sync.Mutex
	seq     uint64
	pending int // collectives issued and not finished
	closed  bool
	execMu  sync.Mutex // held while a collective executes
	gens    map[string]int
	queue   chan *request
	loopWG  sync.WaitGroup

	p2pMu   sync.Mutex
	sendQ   []chan *request
	recvQ   []chan *request
	sendSeq []uint64
	recvSeq []uint64
	p2pWG   sync.WaitGroup

	brokenOnce sync.Once
	brokenErr  error
	brokenCh   chan struct{} // closed when the group is aborted
	abortDone  chan struct{} // closed once abort has told the peers
	told       atomic.Bool   // abort sent the peers msgAbort
	closing    atomic.Bool

	scratch [][][]byte // TCP reduction segments, per peer
	shm     *shmState
}

func (g *group) Rank() int         { return g.rank }
func (g *group) Size() int         { return g.size }
func (g *group) Name() string      { return g.name }
func (g *group) Ranks() []int      { return slices.Clone(g.world) }
func (g *group) Transport() string { return g.transport }

func (g *group) AllReduce(ctx context.Context, buf Buffer, op ReduceOp) error {
	return g.do(ctx, &request{kind: opAllReduce, dtype: buf.dtype, op: op, a: buf})
}

func (g *group) AllReduceAsync(ctx context.Context, buf Buffer, op ReduceOp) *Work {
	return g.submit(ctx, &request{kind: opAllReduce, dtype: buf.dtype, op: op, a: buf})
}

func (g *group) ReduceScatter(ctx context.Context, send, recv Buffer, op ReduceOp) error {
	return g.do(ctx, &request{kind: opReduceScatter, dtype: send.dtype, op: op, a: send, b: recv})
}

func (g *group) ReduceScatterAsync(ctx context.Context, send, recv Buffer, op ReduceOp) *Work {
	return g.submit(ctx, &request{kind: opReduceScatter, dtype: send.dtype, op: op, a: send, b: recv})
}

func (g *group) AllGather(ctx context.Context, send, recv Buffer) error {
	return g.do(ctx, &request{kind: opAllGather, dtype: send.dtype, a: send, b: recv})
}

func (g *group) AllGatherAsync(ctx context.Context, send, recv Buffer) *Work {
	return g.submit(ctx, &request{kind: opAllGather, dtype: send.dtype, a: send, b: recv})
}

func (g *group) Broadcast(ctx context.Context, buf Buffer, root int) error {
	return g.do(ctx, &request{kind: opBroadcast, dtype: buf.dtype, a: buf, root: root})
}

func (g *group) BroadcastAsync(ctx context.Context, buf Buffer, root int) *Work {
	return g.submit(ctx, &request{kind: opBroadcast, dtype: buf.dtype, a: buf, root: root})
}

func (g *group) AllToAll(ctx context.Context, send, recv Buffer, sendCounts, recvCounts []int) error {
	return g.AllToAllAsync(ctx, send, recv, sendCounts, recvCounts).Wait()
}

func (g *group) AllToAllAsync(ctx context.Context, send, recv Buffer, sendCounts, recvCounts []int) *Work {
	return g.submit(ctx, &request{kind: opAllToAll, dtype: send.dtype, a: send, b: recv,
		sendCounts: slices.Clone(sendCounts), recvCounts: slices.Clone(recvCounts)})
}

func (g *group) Send(ctx context.Context, buf Buffer, peer int) error {
	return g.SendAsync(ctx, buf, peer).Wait()
}

func (g *group) SendAsync(ctx context.Context, buf Buffer, peer int) *Work {
	return g.submit(ctx, &request{kind: opSend, dtype: buf.dtype, a: buf, peer: peer})
}

func (g *group) Recv(ctx context.Context, buf Buffer, peer int) error {
	return g.RecvAsync(ctx, buf, peer).Wait()
}

func (g *group) RecvAsync(ctx context.Context, buf Buffer, peer int) *Work {
	return g.submit(ctx, &request{kind: opRecv, dtype: buf.dtype, a: buf, peer: peer})
}

func (g *group) Barrier(ctx context.Context) error { return g.do(ctx, &request{kind: opBarrier}) }

func (g *group) BarrierAsync(ctx context.Context) *Work {
	return g.submit(ctx, &request{kind: opBarrier})
}

// validate checks a request's arguments against the group; the errors are
// local (nothing was sent) and do not abort the group.
func (g *group) validate(r *request) error {
	if r.kind != opBarrier && !r.dtype.valid() {
		return fmt.Errorf("invalid dtype %d", int(r.dtype))
	}
	switch r.kind {
	case opAllReduce, opReduceScatter:
		if !r.op.valid() {
			return fmt.Errorf("invalid reduce op %d", int(r.op))
		}
		if r.op == Avg && !r.dtype.isFloat() {
			return fmt.Errorf("avg of %s elements is not supported", r.dtype)
		}
	}
	switch r.kind {
	case opReduceScatter:
		if r.b.dtype != r.a.dtype {
			return fmt.Errorf("send is %s but recv is %s", r.a.dtype, r.b.dtype)
		}
		if want := ChunkLen(r.a.n, g.size, g.rank); r.b.n != want {
			return fmt.Errorf("recv has %d elements, want %d (chunk %d of %d elements over %d ranks)", r.b.n, want, g.rank, r.a.n, g.size)
		}
		if overlapsBadly(r.a, r.b, g.size, g.rank) {
			return errors.New("recv overlaps send other than as this rank's chunk")
		}
	case opAllGather:
		if r.b.dtype != r.a.dtype {
			return fmt.Errorf("send is %s but recv is %s", r.a.dtype, r.b.dtype)
		}
		if want := ChunkLen(r.b.n, g.size, g.rank); r.a.n != want {
			return fmt.Errorf("send has %d elements, want %d (chunk %d of %d elements over %d ranks)", r.a.n, want, g.rank, r.b.n, g.size)
		}
		if overlapsBadly(r.b, r.a, g.size, g.rank) {
			return errors.New("send overlaps recv other than as this rank's chunk")
		}
	case opBroadcast:
		if r.root < 0 || r.root >= g.size {
			return fmt.Errorf("root %d out of range [0, %d)", r.root, g.size)
		}
	case opSend, opRecv:
		if r.peer < 0 || r.peer >= g.size || r.peer == g.rank {
			return fmt.Errorf("peer %d is not another rank of a group of %d (this rank is %d)", r.peer, g.size, g.rank)
		}
	case opAllToAll:
		if r.b.dtype != r.a.dtype {
			return fmt.Errorf("send is %s but recv is %s", r.a.dtype, r.b.dtype)
		}
		if overlap(r.a.b, r.b.b) {
			return errors.New("send and recv overlap")
		}
		var err error
		if r.sendCounts, r.sendOff, err = counts(r.sendCounts, r.a.n, g.size, "send"); err != nil {
			return err
		}
		if r.recvCounts, r.recvOff, err = counts(r.recvCounts, r.b.n, g.size, "recv"); err != nil {
			return err
		}
		if r.sendCounts[g.rank] != r.recvCounts[g.rank] {
			return fmt.Errorf("sends %d elements to itself but receives %d", r.sendCounts[g.rank], r.recvCounts[g.rank])
		}
	}
	return nil
}

func counts(c []int, n, size int, what string) ([]int, []int, error) {
	if c == nil {
		c = make([]int, size)
		for i := range c {
			c[i] = ChunkLen(n, size, i)
		}
	}
	if len(c) != size {
		return nil, nil, fmt.Errorf("%d %s counts for a group of %d", len(c), what, size)
	}
	off := make([]int, size+1)
	for i, v := range c {
		if v < 0 {
			return nil, nil, fmt.Errorf("%s count %d of rank %d is negative", what, v, i)
		}
		off[i+1] = off[i] + v
	}
	if off[size] != n {
		return nil, nil, fmt.Errorf("%s counts add up to %d but the buffer has %d elements", what, off[size], n)
	}
	return c, off, nil
}

func overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0 := uintptr(unsafePointer(a))
	b0 := uintptr(unsafePointer(b))
	return a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a))
}

// overlapsBadly reports whether part overlaps full other than being exactly
// chunk rank of full.
func overlapsBadly(full, part Buffer, size, rank int) bool {
	if !overlap(full.b, part.b) {
		return false
	}
	lo, hi := ChunkBounds(full.n, size, rank)
	c := full.bytes(lo, hi)
	return len(c) != len(part.b) || unsafePointer(c) != unsafePointer(part.b)
}

// do runs a request synchronously: on the calling goroutine when the group
// has nothing else queued (saving two goroutine hand-offs), else queued.
func (g *group) do(ctx context.Context, r *request) error {
	start := time.Now()
	w := g.submitMode(ctx, r, true)
	<-w.done
	blocked(w.kind, start)
	return w.err
}

func (g *group) submit(ctx context.Context, r *request) *Work {
	return g.submitMode(ctx, r, false)
}

func (g *group) submitMode(ctx context.Context, r *request, inline bool) *Work {
	w := newWork()
	w.kind = r.kind
	if r.kind != opBarrier {
		w.bytes = int64(r.count()) * int64(r.dtype.Size())
		inFlight.Add(w.bytes)
	}
	r.work = w
	if ctx == nil {
		ctx = context.Background()
	}
	r.ctx = ctx
	if err := g.validate(r); err != nil {
		w.finish(fmt.Errorf("comm: %s on group %s: %w", r.kind, g.name, err))
		return w
	}
	if r.kind == opSend || r.kind == opRecv {
		g.submitP2P(r)
		return w
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		w.finish(fmt.Errorf("comm: %s on group %s: %w", r.kind, g.name, ErrClosed))
		return w
	}
	g.seq++
	r.seq = g.seq
	r.rec = g.hub.flight.add(g, r)
	r.stopCtx = context.AfterFunc(ctx, func() {
		g.abort(fmt.Errorf("%s #%d cancelled: %w", r.kind, r.seq, context.Cause(ctx)))
	})
	g.pending++
	if inline && g.pending == 1 {
		// Nothing queued or running: operations issued from now on
		// queue up behind this one (execMu).
		g.execMu.Lock()
		g.mu.Unlock()
		g.execute(r)
		g.execMu.Unlock()
		return w
	}
	g.queue <- r
	g.mu.Unlock()
	return w
}

func (g *group) loop() {
	defer g.loopWG.Done()
	for r := range g.queue {
		g.execMu.Lock()
		g.execute(r)
		g.execMu.Unlock()
	}
}

// execute runs one request on the calling goroutine and completes its Work.
func (g *group) execute(r *request) {
	var err error
	if cerr := context.Cause(r.ctx); cerr != nil && !g.isBroken() {
		// Skipping the operation would desynchronise the peers.
		g.abort(fmt.Errorf("%s #%d cancelled before it started: %w", r.kind, r.seq, cerr))
	}
	if g.isBroken() {
		// Another goroutine (a monitor, a context) aborted the group and
		// may still be telling the peers why. Do not return before it has:
		// a caller that closes the group or exits on this error would
		// otherwise close the control connections first, and the peers
		// would see this rank vanish without notice and report it dead
		// instead of naming the rank that failed.
		<-g.abortDone
		err = g.wrap(r, &abortedErr{g.brokenErr})
	} else {
		g.hub.flight.start(r.rec)
		start := time.Now()
		r.started = start
		deadline := start.Add(g.opts.Timeout)
		switch {
		case r.kind == opSend || r.kind == opRecv:
			err = g.runP2P(r, deadline)
		case g.shm != nil:
			err = g.shmRun(r, deadline)
		default:
			err = g.tcpRun(r, deadline)
		}
		if err != nil {
			err = g.opError(r, err)
			g.abort(err)
		}
	}
	if r.stopCtx != nil {
		r.stopCtx()
	}
	g.hub.flight.end(r.rec, err)
	g.traceOp(r)
	if r.kind != opSend && r.kind != opRecv {
		g.mu.Lock()
		g.pending--
		g.mu.Unlock()
	}
	r.work.finish(err)
}

func (g *group) isBroken() bool {
	select {
	case <-g.brokenCh:
		return true
	default:
		return false
	}
}

func (g *group) wrap(r *request, cause error) *Error {
	e := &Error{Group: g.name, Ranks: g.world, Op: r.kind.String(), Seq: r.seq, Err: cause}
	var pe *peerErr
	if errors.As(cause, &pe) {
		e.Peers = []int{pe.rank}
	}
	return e
}

// connFailure is an I/O error on the connection to a peer.
type connFailure struct {
	peer int // group rank
	err  error
}

func (c *connFailure) Error() string { return c.err.Error() }
func (c *connFailure) Unwrap() error { return c.err }

// errOpAborted stops helper goroutines of an operation that already failed.
var errOpAborted = errors.New("operation aborted")

// opError turns the failure of r into an *Error naming the peers at fault.
func (g *group) opError(r *request, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var we *waitErr
	if errors.As(err, &we) {
		e = g.wrap(r, we)
		e.Timeout, e.After, e.Peers = true, g.opts.Timeout, we.waiting
		return e
	}
	var cf *connFailure
	if errors.As(err, &cf) {
		// The control connection tells why a peer went away; give its
		// monitor a moment to find out.
		p := g.peers[cf.peer]
		select {
		case <-p.gone:
		case <-g.brokenCh:
		case <-time.After(time.Second):
		}
		if pe := p.goneErr(); pe != nil {
			return g.wrap(r, pe)
		}
		if g.isBroken() {
			return g.wrap(r, g.brokenErr)
		}
		return g.wrap(r, fmt.Errorf("connection to rank %d: %w", p.world, cf.err))
	}
	if errors.Is(err, errOpAborted) && g.isBroken() {
		return g.wrap(r, g.brokenErr)
	}
	return g.wrap(r, err)
}

// abort marks the group failed, tells the peers why and closes the data
// connections so that blocked operations return.
func (g *group) abort(err error) {
	g.brokenOnce.Do(func() {
		defer close(g.abortDone)
		g.brokenErr = err
		close(g.brokenCh)
		if g.closing.Load() {
			return
		}
		g.told.Store(true)
		reason := []byte(err.Error())
		var wg sync.WaitGroup
		for _, p := range g.peers {
			if p == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if p.state.Load() == peerAlive {
					p.sendCtrl(msgAbort, reason)
				}
				p.closeConns()
			}()
		}
		wg.Wait()
		// Record what this rank was doing, whoever failed first.
		g.hub.flight.dumpTo(g.opts.TraceDir)
	})
}

// monitor reads the control connection of p until the peer leaves.
func (g *group) monitor(p *peer) {
	for {
		typ, payload, err := readMsg(p.ctrl)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || g.closing.Load() {
				// This rank closed the connection (Close or abort).
				return
			}
			if g.isBroken() {
				// This rank aborted the group and told p, which closes its
				// end in response; before this rank's abort got round to
				// closing the connection, that reads as a plain EOF. It is
				// no death: p did as told (and the group already failed,
				// with the cause that matters). Taking it for one would
				// blame p, in the error of the operation that was running,
				// for the failure of another rank.
				return
			}
			info := g.hub.info(p.world)
			why := "connection closed without notice"
			if !errors.Is(err, io.EOF) {
				why = "control connection failed: " + err.Error()
			}
			p.setGone(peerDead, fmt.Sprintf("%s (pid %d on %s; process exited or was killed?)", why, info.PID, info.host()))
			g.abort(&peerErr{rank: p.world, kind: peerDead, reason: p.reason})
			return
		}
		switch typ {
		case msgAbort:
			p.setGone(peerAborted, string(payload))
			g.abort(&peerErr{rank: p.world, kind: peerAborted, reason: p.reason})
			return
		case msgBye:
			p.setGone(peerBye, "")
			return
		}
	}
}

// Close implements Group.
func (g *group) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	close(g.queue)
	g.mu.Unlock()
	g.loopWG.Wait()
	g.execMu.Lock() // an operation running on its caller's goroutine
	g.execMu.Unlock()
	g.p2pMu.Lock()
	for i := range g.sendQ {
		if g.sendQ[i] != nil {
			close(g.sendQ[i])
		}
		if g.recvQ[i] != nil {
			close(g.recvQ[i])
		}
	}
	g.sendQ, g.recvQ = nil, nil
	g.p2pMu.Unlock()
	g.p2pWG.Wait()

	g.closing.Store(true)
	if g.isBroken() {
		// An abort that began before closing was set is telling the peers
		// why; let it finish before closing the connections it writes to.
		// One that begins after returns at once without telling them, and
		// the peers are told goodbye instead, so that none of them takes
		// this rank's closed connections for its death.
		<-g.abortDone
	}
	bye := !g.told.Load()
	var wg sync.WaitGroup
	for _, p := range g.peers {
		if p == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if bye && p.state.Load() == peerAlive {
				p.sendCtrl(msgBye, nil)
			}
			p.closeConns()
		}()
	}
	wg.Wait()
	if g.shm != nil {
		g.shm.close()
	}
	g.hub.removeGroup(g)
	return nil
}

// NewGroup implements Group.
func (g *group) NewGroup(ctx context.Context, ranks []int, name string) (Group, error) {
	if len(ranks) == 0 {
		return nil, fmt.Errorf("comm: new group %q: no ranks", name)
	}
	world := make([]int, len(ranks))
	seen := make(map[int]bool)
	member := false
	for i, r := range ranks {
		if r < 0 || r >= g.size {
			return nil, fmt.Errorf("comm: new group %q: rank %d out of range for group %s of %d ranks", name, r, g.name, g.size)
		}
		if seen[r] {
			return nil, fmt.Errorf("comm: new group %q: rank %d listed twice", name, r)
		}
		seen[r] = true
		member = member || r == g.rank
		world[i] = g.world[r]
	}
	if !member {
		return nil, fmt.Errorf("comm: new group %q: this rank (%d) is not in ranks %v", name, g.rank, ranks)
	}
	id := fmt.Sprintf("%s%v", name, world)
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, fmt.Errorf("comm: new group %q: %w", name, ErrClosed)
	}
	gen := g.gens[id]
	g.gens[id]++
	g.mu.Unlock()
	key := fmt.Sprintf("%s/%s#%d", g.key, id, gen)
	return g.hub.newGroup(ctx, key, name, world, g.opts)
}

func pidOf() int { return os.Getpid() }

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
