package comm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// rankInfo is what each rank publishes in the Store.
type rankInfo struct {
	Addr   string `json:"addr"`
	HostID string `json:"host_id"`
	PID    int    `json:"pid"`
}

func (r rankInfo) host() string {
	h, _, err := net.SplitHostPort(r.Addr)
	if err != nil {
		return r.Addr
	}
	return h
}

type connKey struct {
	group string
	from  int
	kind  int
	idx   int
}

// hub is the per-world state of a process: the listener every group's
// connections arrive on, the address table and the flight recorder.
type hub struct {
	opts   Options
	ln     net.Listener
	nonce  [16]byte
	key    []byte // the world key of the data-plane authentication
	rank   int
	size   int
	infos  []rankInfo
	flight *flight

	refused refusals

	mu      sync.Mutex
	closed  bool
	pending map[connKey]net.Conn
	waiters map[connKey]chan net.Conn
	groups  map[*group]bool
	world   *group
}

// NewWorld creates the world group of size ranks, this process being rank.
// Every rank calls it with the same size and Store. It listens on
// opts.Addr, publishes its address under opts.StorePrefix, reads every
// other rank's, and connects. With Transport "auto" the world uses shared
// memory when all ranks share opts.HostID and TCP otherwise.
func NewWorld(ctx context.Context, store Store, rank, size int, opts Options) (Group, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if size <= 0 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("comm: rank %d out of range for world size %d", rank, size)
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("comm: listen on %s: %w", opts.Addr, err)
	}
	ok := false
	defer func() {
		if !ok {
			ln.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ctx, cancel := context.WithTimeout(ctx, opts.InitTimeout)
	defer cancel()

	h := &hub{
		opts: opts, ln: ln, rank: rank, size: size,
		infos:   make([]rankInfo, size),
		pending: make(map[connKey]net.Conn),
		waiters: make(map[connKey]chan net.Conn),
		groups:  make(map[*group]bool),
	}
	p := opts.StorePrefix
	if rank == 0 {
		rand.Read(h.nonce[:])
		if err := store.Set(ctx, p+"/nonce", []byte(hex.EncodeToString(h.nonce[:]))); err != nil {
			return nil, fmt.Errorf("comm: publish world id: %w", err)
		}
	} else {
		v, err := store.Get(ctx, p+"/nonce")
		if err != nil {
			return nil, fmt.Errorf("comm: rank %d waiting for rank 0 to publish the world id: %w", rank, err)
		}
		if n, err := hex.Decode(h.nonce[:], v); err != nil || n != len(h.nonce) {
			return nil, fmt.Errorf("comm: bad world id %q in store key %s/nonce", v, p)
		}
	}
	h.key = worldKey(opts.Secret, h.nonce)
	me := rankInfo{Addr: net.JoinHostPort(opts.AdvertiseHost, port), HostID: opts.HostID, PID: pidOf()}
	b, _ := json.Marshal(me)
	if err := store.Set(ctx, p+"/rank/"+strconv.Itoa(rank), b); err != nil {
		return nil, fmt.Errorf("comm: publish address of rank %d: %w", rank, err)
	}
	for r := range size {
		if r == rank {
			h.infos[r] = me
			continue
		}
		v, err := store.Get(ctx, p+"/rank/"+strconv.Itoa(r))
		if err != nil {
			return nil, fmt.Errorf("comm: rank %d waiting for the address of rank %d: %w", rank, r, err)
		}
		if err := json.Unmarshal(v, &h.infos[r]); err != nil {
			return nil, fmt.Errorf("comm: address of rank %d: %w", r, err)
		}
	}
	h.flight = newFlight(rank, size, opts.FlightSize)
	go h.acceptLoop()
	ranks := make([]int, size)
	for i := range ranks {
		ranks[i] = i
	}
	g, err := h.newGroup(ctx, p+"/world", "world", ranks, opts)
	if err != nil {
		h.close()
		return nil, err
	}
	h.mu.Lock()
	h.world = g
	h.mu.Unlock()
	registerFlight(h.flight)
	ok = true
	return g, nil
}

func (h *hub) info(world int) rankInfo { return h.infos[world] }

func (h *hub) acceptLoop() {
	for {
		c, err := h.ln.Accept()
		if err != nil {
			h.mu.Lock()
			closed := h.closed
			h.mu.Unlock()
			if closed {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go h.handshake(c)
	}
}

// handshake authenticates an accepted connection (see auth.go) and hands
// it to the group that waits for it. A connection that fails is closed
// without a word and counted in h.refused.
func (h *hub) handshake(c net.Conn) {
	c.SetDeadline(time.Now().Add(authTimeout))
	hl, err := authAccept(c, h.key, h.nonce, h.rank, h.size)
	if err != nil {
		c.Close()
		h.refused.add(c.RemoteAddr(), err)
		return
	}
	c.SetDeadline(time.Time{})
	h.tune(c, hl.kind)
	key := connKey{hl.group, hl.from, hl.kind, hl.idx}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		c.Close()
		return
	}
	if ch, ok := h.waiters[key]; ok {
		delete(h.waiters, key)
		ch <- c
		return
	}
	if old, ok := h.pending[key]; ok {
		old.Close()
	}
	h.pending[key] = c
}

func (h *hub) tune(c net.Conn, kind int) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	tc.SetNoDelay(true)
	if kind != connCtrl && h.opts.SocketBuffer > 0 {
		tc.SetReadBuffer(h.opts.SocketBuffer)
		tc.SetWriteBuffer(h.opts.SocketBuffer)
	}
}

// claim returns the connection a peer dialed for key, waiting for it.
func (h *hub) claim(ctx context.Context, key connKey) (net.Conn, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, ErrClosed
	}
	if c, ok := h.pending[key]; ok {
		delete(h.pending, key)
		h.mu.Unlock()
		return c, nil
	}
	ch := make(chan net.Conn, 1)
	h.waiters[key] = ch
	h.mu.Unlock()
	select {
	case c := <-ch:
		return c, nil
	case <-ctx.Done():
		h.mu.Lock()
		delete(h.waiters, key)
		h.mu.Unlock()
		select {
		case c := <-ch:
			c.Close()
		default:
		}
		return nil, fmt.Errorf("%w%s", ctx.Err(), h.refused.note())
	}
}

// dial connects to world rank to for key.
func (h *hub) dial(ctx context.Context, to int, key connKey) (net.Conn, error) {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", h.infos[to].Addr)
		if err == nil {
			h.tune(c, key.kind)
			dl := time.Now().Add(authTimeout)
			if d, ok := ctx.Deadline(); ok && d.Before(dl) {
				dl = d
			}
			c.SetDeadline(dl)
			err = authDial(c, h.key, hello{nonce: h.nonce, group: key.group, from: h.rank, kind: key.kind, idx: key.idx}, to)
			c.SetDeadline(time.Time{})
			if err == nil {
				return c, nil
			}
			c.Close()
			if errors.Is(err, ErrAuth) {
				return nil, err
			}
		}
		if ctx.Err() != nil || !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// groupInfo is exchanged by every pair of members when a group is made.
type groupInfo struct {
	Key       string `json:"key"`
	World     []int  `json:"world"`
	Transport string `json:"transport"`
}

// newGroup connects this rank to the other members (world ranks world) of
// the group key.
func (h *hub) newGroup(ctx context.Context, key, name string, world []int, opts Options) (*group, error) {
	me := slices.Index(world, h.rank)
	n := len(world)
	ctx, cancel := context.WithTimeout(ctx, opts.InitTimeout)
	defer cancel()

	transport, err := h.chooseTransport(world, opts.Transport)
	if err != nil {
		return nil, fmt.Errorf("comm: new group %s: %w", name, err)
	}
	g := &group{
		hub: h, key: key, name: name, rank: me, size: n, world: world,
		opts: opts, transport: transport,
		peers:     make([]*peer, n),
		segBytes:  max(opts.SegmentBytes&^7, 64),
		gens:      make(map[string]int),
		queue:     make(chan *request, 1024),
		brokenCh:  make(chan struct{}),
		abortDone: make(chan struct{}),
		scratch:   make([][][]byte, n),
	}
	kinds := []int{connCtrl, connP2P}
	if transport == "tcp" {
		kinds = append(kinds, connData)
	}
	var mu sync.Mutex
	var firstErr error
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	var wg sync.WaitGroup
	for q := range n {
		if q == me {
			continue
		}
		p := &peer{rank: q, world: world[q], gone: make(chan struct{})}
		g.peers[q] = p
		for _, kind := range kinds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var c net.Conn
				var err error
				if h.rank > p.world {
					c, err = h.dial(ctx, p.world, connKey{key, h.rank, kind, 0})
				} else {
					c, err = h.claim(ctx, connKey{key, p.world, kind, 0})
				}
				if err != nil {
					fail(fmt.Errorf("connecting with rank %d (%s): %w", p.world, h.infos[p.world].Addr, err))
					return
				}
				mu.Lock()
				switch kind {
				case connCtrl:
					p.ctrl = c
				case connData:
					p.data = c
				case connP2P:
					p.p2p = c
				}
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = g.exchangeReady(ctx, groupInfo{Key: key, World: world, Transport: transport})
	}
	if firstErr == nil && transport == "shm" {
		firstErr = g.setupShm(ctx)
	}
	if firstErr != nil {
		for _, p := range g.peers {
			if p != nil {
				p.closeConns()
			}
		}
		return nil, fmt.Errorf("comm: new group %s (ranks %v): %w", name, world, firstErr)
	}
	for _, p := range g.peers {
		if p != nil {
			go g.monitor(p)
		}
	}
	g.loopWG.Add(1)
	go g.loop()
	h.mu.Lock()
	h.groups[g] = true
	h.mu.Unlock()
	return g, nil
}

func (h *hub) chooseTransport(world []int, want string) (string, error) {
	if len(world) == 1 {
		return "local", nil
	}
	same := true
	for _, r := range world {
		same = same && h.infos[r].HostID == h.infos[world[0]].HostID
	}
	switch want {
	case "tcp":
		return "tcp", nil
	case "shm":
		if !same {
			return "", fmt.Errorf("transport shm needs all ranks on one host, but ranks %v are on several", world)
		}
		if !shmSupported {
			return "", errors.New("transport shm is not supported on this system")
		}
		return "shm", nil
	}
	if same && shmSupported {
		return "shm", nil
	}
	return "tcp", nil
}

// exchangeReady checks, with every peer, that both sides agree on the group.
func (g *group) exchangeReady(ctx context.Context, mine groupInfo) error {
	b, _ := json.Marshal(mine)
	deadline, _ := ctx.Deadline()
	errs := make(chan error, g.size)
	for _, p := range g.peers {
		if p == nil {
			continue
		}
		go func() {
			p.ctrl.SetDeadline(deadline)
			defer p.ctrl.SetDeadline(time.Time{})
			if err := writeMsg(p.ctrl, msgReady, b); err != nil {
				errs <- fmt.Errorf("rank %d: %w", p.world, err)
				return
			}
			typ, payload, err := readMsg(p.ctrl)
			if err != nil {
				errs <- fmt.Errorf("rank %d did not confirm the group: %w", p.world, err)
				return
			}
			var theirs groupInfo
			if typ != msgReady || json.Unmarshal(payload, &theirs) != nil {
				errs <- fmt.Errorf("rank %d sent a bad group confirmation", p.world)
				return
			}
			if theirs.Transport != mine.Transport || !slices.Equal(theirs.World, mine.World) {
				errs <- fmt.Errorf("rank %d created the group with ranks %v and transport %s, this rank with ranks %v and transport %s",
					p.world, theirs.World, theirs.Transport, mine.World, mine.Transport)
				return
			}
			errs <- nil
		}()
	}
	var first error
	for range g.size - 1 {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (h *hub) removeGroup(g *group) {
	h.mu.Lock()
	delete(h.groups, g)
	isWorld := h.world == g
	var rest []*group
	if isWorld {
		for o := range h.groups {
			rest = append(rest, o)
		}
	}
	h.mu.Unlock()
	if isWorld {
		for _, o := range rest {
			o.Close()
		}
		h.close()
	}
}

func (h *hub) close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	for k, c := range h.pending {
		c.Close()
		delete(h.pending, k)
	}
	h.mu.Unlock()
	h.ln.Close()
	unregisterFlight(h.flight)
}
