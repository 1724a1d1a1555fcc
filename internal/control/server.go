package control

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "github.com/titan-go/titan/internal/control/controlpb"
)

// DefaultAddr is the listen address used when ServerConfig.Addr is empty:
// loopback, any free port.
const DefaultAddr = "127.0.0.1:0"

// DefaultHeartbeatTimeout is used when ServerConfig.HeartbeatTimeout is zero.
const DefaultHeartbeatTimeout = 10 * time.Second

// maxMsgSize bounds one store value (and so one message).
const maxMsgSize = 64 << 20

// ServerConfig configures a control server.
type ServerConfig struct {
	// Addr is the listen address, e.g. "127.0.0.1:0" (the default when
	// empty) or ":29500". An empty host (":29500") means every interface,
	// which is not loopback.
	Addr string
	// JobID names the job; callers presenting another id are refused.
	JobID string
	// Secret must be presented by every caller (metadata "titan-secret") and
	// is compared in constant time. It may only be empty when the server
	// listens on a loopback address, or when Insecure is set.
	Secret string
	// WorldSize is the number of workers that make up the job.
	WorldSize int
	// TLS, if non-nil, makes the server speak TLS with this configuration
	// (see JobTLS and LoadServerTLS). It must hold a certificate. It may
	// only be nil when the server listens on a loopback address, or when
	// Insecure is set.
	TLS *tls.Config
	// HeartbeatTimeout is how long a rank that has sent heartbeats may stay
	// silent before it is declared lost (default DefaultHeartbeatTimeout).
	// Monitoring of a rank starts with its first heartbeat, so clients that
	// never send any are never declared lost, and ends with ReportExit or
	// the EventLost it produces. Detection takes between HeartbeatTimeout
	// and HeartbeatTimeout plus min(HeartbeatTimeout/4, 1s).
	HeartbeatTimeout time.Duration
	// Insecure allows an empty Secret and plain text (TLS nil) on a
	// non-loopback listen address. Only for networks where every host that
	// can reach the port is trusted.
	Insecure bool
}

// Server is the control server of one job. Create it with NewServer, run it
// with Serve and release it with Stop.
type Server struct {
	cfg        ServerConfig
	lis        net.Listener
	grpc       *grpc.Server
	secretHash [sha256.Size]byte
	jobHash    [sha256.Size]byte

	stopped chan struct{} // closed by Stop; releases every blocked call
	// lastRefusal is when the last EventRefused went out (Unix ns).
	lastRefusal atomic.Int64
	stopOnce    sync.Once
	bg          sync.WaitGroup // event pump and heartbeat monitor

	mu sync.Mutex
	// Rendezvous state. A future elastic mode would add a round number here
	// and reset members/complete/joined when a new round is opened.
	members  map[int]*Member // by rank
	lws      int             // local world size agreed by the joiners so far
	complete bool
	joined   chan struct{} // closed when the rendezvous completes
	// Store state.
	kv       map[string][]byte
	keyWait  map[string]chan struct{} // closed when the key is set
	barriers map[string]*barrier
	// Health state.
	lastBeat map[int]time.Time // ranks under heartbeat monitoring
	lost     map[int]bool
	exited   map[int]bool

	evMu     sync.Mutex
	evQueue  []Event
	evNotify chan struct{}
	events   chan Event
}

// barrier is one generation of a named barrier.
type barrier struct {
	n       int
	arrived int
	release chan struct{}
}

// NewServer validates cfg and starts listening on cfg.Addr. The server does
// not answer calls until Serve is called, but clients may already connect.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	if cfg.WorldSize < 1 {
		return nil, fmt.Errorf("control: world size %d must be at least 1", cfg.WorldSize)
	}
	if cfg.JobID == "" {
		return nil, errors.New("control: job id must not be empty")
	}
	if cfg.HeartbeatTimeout < 0 {
		return nil, fmt.Errorf("control: heartbeat timeout %v must not be negative", cfg.HeartbeatTimeout)
	}
	if cfg.HeartbeatTimeout == 0 {
		cfg.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	host, _, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("control: listen address %q: %w", cfg.Addr, err)
	}
	if !isLoopbackHost(host) && cfg.Secret == "" && !cfg.Insecure {
		return nil, fmt.Errorf("control: listen address %q is not loopback, so a job secret is required (set a secret, e.g. from NewSecret, or listen on 127.0.0.1)", cfg.Addr)
	}
	if !isLoopbackHost(host) && cfg.TLS == nil && !cfg.Insecure {
		return nil, fmt.Errorf("control: listen address %q is not loopback, so the control plane needs TLS (set a TLS configuration, e.g. from JobTLS, or listen on 127.0.0.1)", cfg.Addr)
	}
	if cfg.TLS != nil && len(cfg.TLS.Certificates) == 0 && cfg.TLS.GetCertificate == nil && cfg.TLS.GetConfigForClient == nil {
		return nil, errors.New("control: TLS config has no server certificate")
	}

	lis, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("control: cannot listen on %s: address is already in use (another job or a stale process holds the port; choose another port, or port 0 for any free one): %w", cfg.Addr, err)
		}
		return nil, fmt.Errorf("control: listen on %s: %w", cfg.Addr, err)
	}

	s := newServer(cfg)
	s.lis = lis
	opts := []grpc.ServerOption{
		grpc.UnaryInterceptor(s.unaryAuth),
		grpc.StreamInterceptor(s.streamAuth),
		grpc.MaxRecvMsgSize(maxMsgSize),
		grpc.MaxSendMsgSize(maxMsgSize),
		// Clients ping while they block in long calls; let them.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// Ping silent clients so that calls of dead clients are cancelled.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(refusals{credentials.NewTLS(cfg.TLS), s}))
	}
	s.grpc = grpc.NewServer(opts...)
	pb.RegisterControlServer(s.grpc, &service{s: s})

	s.bg.Add(2)
	go s.pumpEvents()
	go s.monitorHeartbeats()
	return s, nil
}

// newServer returns the state of a server for a validated cfg, without a
// listener, gRPC server or background goroutines.
func newServer(cfg ServerConfig) *Server {
	return &Server{
		cfg:        cfg,
		secretHash: sha256.Sum256([]byte(cfg.Secret)),
		jobHash:    sha256.Sum256([]byte(cfg.JobID)),
		stopped:    make(chan struct{}),
		members:    make(map[int]*Member),
		joined:     make(chan struct{}),
		kv:         make(map[string][]byte),
		keyWait:    make(map[string]chan struct{}),
		barriers:   make(map[string]*barrier),
		lastBeat:   make(map[int]time.Time),
		lost:       make(map[int]bool),
		exited:     make(map[int]bool),
		evNotify:   make(chan struct{}, 1),
		events:     make(chan Event, 64),
	}
}

// isLoopbackHost reports whether a listen host refers to the loopback
// interface only. An empty host means every interface.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if i := strings.IndexByte(host, '%'); i >= 0 {
		host = host[:i]
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Addr returns the address the server listens on, with the actual port when
// the configured port was 0.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Serve answers calls until Stop is called. It returns nil after Stop.
func (s *Server) Serve() error {
	err := s.grpc.Serve(s.lis)
	if err == nil || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	select {
	case <-s.stopped:
		return nil
	default:
	}
	return fmt.Errorf("control: serving on %s: %w", s.Addr(), err)
}

// Stop releases every blocked call (they fail with codes.Unavailable), stops
// serving, closes the listener and closes the Events channel. It is safe to
// call more than once and before Serve.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		close(s.stopped)
		done := make(chan struct{})
		go func() {
			s.grpc.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			s.grpc.Stop()
			<-done
		}
		s.lis.Close() // in case Serve was never called
		s.bg.Wait()
	})
}

// Events returns the channel of membership events. Events are queued without
// bound, so a slow reader never blocks the server. The channel is closed by
// Stop; events not yet read by then may be dropped.
func (s *Server) Events() <-chan Event { return s.events }

// WaitJoined blocks until all WorldSize workers have joined, ctx ends or the
// server is stopped.
func (s *Server) WaitJoined(ctx context.Context) error {
	select {
	case <-s.joined:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("control: waiting for %d workers of job %q to join: %w", s.cfg.WorldSize, s.cfg.JobID, ctx.Err())
	case <-s.stopped:
		return fmt.Errorf("control: server of job %q stopped before the rendezvous completed", s.cfg.JobID)
	}
}

// Members returns the workers that have joined so far, by rank.
func (s *Server) Members() []Member {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.membersLocked()
}

func (s *Server) membersLocked() []Member {
	out := make([]Member, 0, len(s.members))
	for _, m := range s.members {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rank < out[j].Rank })
	return out
}

// emit queues an event for Events.
func (s *Server) emit(e Event) {
	s.evMu.Lock()
	s.evQueue = append(s.evQueue, e)
	s.evMu.Unlock()
	select {
	case s.evNotify <- struct{}{}:
	default:
	}
}

// pumpEvents moves queued events to the Events channel.
func (s *Server) pumpEvents() {
	defer s.bg.Done()
	defer close(s.events)
	for {
		s.evMu.Lock()
		q := s.evQueue
		s.evQueue = nil
		s.evMu.Unlock()
		for i, e := range q {
			select {
			case s.events <- e:
			case <-s.stopped:
				s.flushEvents(q[i:])
				return
			}
		}
		select {
		case <-s.evNotify:
		case <-s.stopped:
			s.evMu.Lock()
			q = s.evQueue
			s.evQueue = nil
			s.evMu.Unlock()
			s.flushEvents(q)
			return
		}
	}
}

// flushEvents hands over what fits in the channel buffer without blocking.
func (s *Server) flushEvents(q []Event) {
	for _, e := range q {
		select {
		case s.events <- e:
		default:
			return
		}
	}
}

// monitorHeartbeats declares ranks lost when their heartbeats stop.
func (s *Server) monitorHeartbeats() {
	defer s.bg.Done()
	timeout := s.cfg.HeartbeatTimeout
	tick := min(max(timeout/4, 5*time.Millisecond), time.Second)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-s.stopped:
			return
		case now := <-t.C:
			s.mu.Lock()
			for rank, last := range s.lastBeat {
				if silent := now.Sub(last); silent > timeout {
					delete(s.lastBeat, rank)
					s.lost[rank] = true
					s.emit(Event{Kind: EventLost, Rank: rank,
						Reason: fmt.Sprintf("no heartbeat for %v (timeout %v)", silent.Round(time.Millisecond), timeout)})
				}
			}
			s.mu.Unlock()
		}
	}
}

// authorize checks the job id and the secret carried by a call. Every
// refusal is the same status, "not admitted", whatever was wrong, and both
// values are compared in constant time (as SHA-256 digests, so that their
// lengths do not show either), so that a caller learns neither the job id
// nor how close its guess came.
func (s *Server) authorize(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	job := sha256.Sum256([]byte(firstValue(md, MetadataJobID)))
	secret := sha256.Sum256([]byte(firstValue(md, MetadataSecret)))
	ok := subtle.ConstantTimeCompare(job[:], s.jobHash[:]) & subtle.ConstantTimeCompare(secret[:], s.secretHash[:])
	if ok != 1 {
		return errNotAdmitted
	}
	return nil
}

// errNotAdmitted is the one answer to a call with a wrong job id or secret.
var errNotAdmitted = status.Error(codes.Unauthenticated, NotAdmitted)

func firstValue(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (s *Server) unaryAuth(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (s *Server) streamAuth(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := s.authorize(ss.Context()); err != nil {
		return err
	}
	return handler(srv, ss)
}

// errStopped is returned to calls released by Stop.
func errStopped() error { return status.Error(codes.Unavailable, "control server stopped") }

// ctxErr converts the end of a call's context into a status error.
func ctxErr(ctx context.Context) error { return status.FromContextError(ctx.Err()).Err() }

// checkRank validates a rank named by a caller.
func (s *Server) checkRank(rank int32) error {
	if rank < 0 || int(rank) >= s.cfg.WorldSize {
		return status.Errorf(codes.InvalidArgument, "rank %d outside world size %d", rank, s.cfg.WorldSize)
	}
	return nil
}

// service implements pb.ControlServer on top of Server.
type service struct {
	pb.UnimplementedControlServer
	s *Server
}

func (v *service) Ping(context.Context, *pb.PingRequest) (*pb.PingResponse, error) {
	return &pb.PingResponse{JobId: v.s.cfg.JobID, WorldSize: int32(v.s.cfg.WorldSize)}, nil
}

func (v *service) Join(ctx context.Context, req *pb.JoinRequest) (*pb.JoinResponse, error) {
	s := v.s
	nr, lr, lws := int(req.NodeRank), int(req.LocalRank), int(req.LocalWorldSize)
	switch {
	case lws < 1:
		return nil, status.Errorf(codes.InvalidArgument, "local world size %d must be at least 1", lws)
	case lr < 0 || lr >= lws:
		return nil, status.Errorf(codes.InvalidArgument, "local rank %d out of range [0, %d)", lr, lws)
	case nr < 0:
		return nil, status.Errorf(codes.InvalidArgument, "node rank %d must not be negative", nr)
	}
	var peerAddr string
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		peerAddr = p.Addr.String()
	}

	s.mu.Lock()
	if s.complete {
		s.mu.Unlock()
		// Seam for elastic restarts: instead of refusing, a future version
		// would open a new rendezvous round here.
		return nil, status.Errorf(codes.FailedPrecondition, "rendezvous already complete: all %d ranks of job %q have joined (node_rank=%d local_rank=%d came too late; restarting workers is not supported)", s.cfg.WorldSize, s.cfg.JobID, nr, lr)
	}
	if s.lws != 0 && lws != s.lws {
		s.mu.Unlock()
		return nil, status.Errorf(codes.InvalidArgument, "local world size %d (node_rank=%d local_rank=%d) differs from %d reported by the workers already joined; every node must run the same number of workers", lws, nr, lr, s.lws)
	}
	rank := nr*lws + lr
	if rank >= s.cfg.WorldSize {
		s.mu.Unlock()
		return nil, status.Errorf(codes.InvalidArgument, "slot node_rank=%d local_rank=%d (local world size %d) gives rank %d, outside world size %d", nr, lr, lws, rank, s.cfg.WorldSize)
	}
	if m, ok := s.members[rank]; ok {
		s.mu.Unlock()
		return nil, status.Errorf(codes.AlreadyExists, "slot node_rank=%d local_rank=%d (rank %d) already joined from %s", nr, lr, rank, m.Peer)
	}
	me := &Member{Rank: rank, NodeRank: nr, LocalRank: lr, LocalWorldSize: lws, Addr: req.Addr, Peer: peerAddr}
	s.members[rank] = me
	s.lws = lws
	s.emit(Event{Kind: EventJoined, Rank: rank})
	if len(s.members) == s.cfg.WorldSize {
		s.complete = true
		close(s.joined)
	}
	s.mu.Unlock()

	resp := &pb.JoinResponse{Rank: int32(rank), WorldSize: int32(s.cfg.WorldSize)}
	select {
	case <-s.joined:
		return resp, nil
	case <-s.stopped:
		return nil, errStopped()
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.complete {
		return resp, nil
	}
	// Give the slot back so that a retry (or a replacement) can take it.
	if s.members[rank] == me {
		delete(s.members, rank)
		if len(s.members) == 0 {
			s.lws = 0
		}
		s.emit(Event{Kind: EventLeft, Rank: rank, Reason: ctx.Err().Error()})
	}
	return nil, ctxErr(ctx)
}

func (v *service) Members(context.Context, *pb.MembersRequest) (*pb.MembersResponse, error) {
	s := v.s
	s.mu.Lock()
	ms := s.membersLocked()
	complete := s.complete
	s.mu.Unlock()
	resp := &pb.MembersResponse{WorldSize: int32(s.cfg.WorldSize), Complete: complete}
	for _, m := range ms {
		resp.Members = append(resp.Members, &pb.Member{
			Rank: int32(m.Rank), NodeRank: int32(m.NodeRank), LocalRank: int32(m.LocalRank),
			LocalWorldSize: int32(m.LocalWorldSize), Addr: m.Addr, Peer: m.Peer,
		})
	}
	return resp, nil
}

// setLocked stores value under key and wakes the key's waiters.
func (s *Server) setLocked(key string, value []byte) {
	s.kv[key] = value
	if ch, ok := s.keyWait[key]; ok {
		close(ch)
		delete(s.keyWait, key)
	}
}

// waitKey returns the value of key, waiting until it is set.
func (s *Server) waitKey(ctx context.Context, key string) ([]byte, error) {
	if key == "" {
		return nil, status.Error(codes.InvalidArgument, "empty key")
	}
	for {
		s.mu.Lock()
		if v, ok := s.kv[key]; ok {
			s.mu.Unlock()
			return v, nil
		}
		ch, ok := s.keyWait[key]
		if !ok {
			ch = make(chan struct{})
			s.keyWait[key] = ch
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctxErr(ctx)
		case <-s.stopped:
			return nil, errStopped()
		}
	}
}

func (v *service) Set(_ context.Context, req *pb.SetRequest) (*pb.SetResponse, error) {
	if req.Key == "" {
		return nil, status.Error(codes.InvalidArgument, "empty key")
	}
	value := append([]byte{}, req.Value...)
	v.s.mu.Lock()
	v.s.setLocked(req.Key, value)
	v.s.mu.Unlock()
	return &pb.SetResponse{}, nil
}

func (v *service) Get(ctx context.Context, req *pb.GetRequest) (*pb.GetResponse, error) {
	val, err := v.s.waitKey(ctx, req.Key)
	if err != nil {
		return nil, err
	}
	return &pb.GetResponse{Value: val}, nil
}

func (v *service) Wait(ctx context.Context, req *pb.WaitRequest) (*pb.WaitResponse, error) {
	for _, k := range req.Keys {
		if _, err := v.s.waitKey(ctx, k); err != nil {
			return nil, err
		}
	}
	return &pb.WaitResponse{}, nil
}

func (v *service) Add(_ context.Context, req *pb.AddRequest) (*pb.AddResponse, error) {
	s := v.s
	if req.Key == "" {
		return nil, status.Error(codes.InvalidArgument, "empty key")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var cur int64
	if old, ok := s.kv[req.Key]; ok {
		n, err := strconv.ParseInt(string(old), 10, 64)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "key %q holds %q, not an integer counter", req.Key, truncate(old, 32))
		}
		cur = n
	}
	next := cur + req.Delta
	if (req.Delta > 0 && next < cur) || (req.Delta < 0 && next > cur) {
		return nil, status.Errorf(codes.OutOfRange, "counter %q overflows: %d + %d", req.Key, cur, req.Delta)
	}
	s.setLocked(req.Key, []byte(strconv.FormatInt(next, 10)))
	return &pb.AddResponse{Value: next}, nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

func (v *service) Barrier(ctx context.Context, req *pb.BarrierRequest) (*pb.BarrierResponse, error) {
	s := v.s
	n := int(req.N)
	if req.Name == "" {
		return nil, status.Error(codes.InvalidArgument, "empty barrier name")
	}
	if n < 1 {
		return nil, status.Errorf(codes.InvalidArgument, "barrier %q: participant count %d must be at least 1", req.Name, n)
	}
	s.mu.Lock()
	b := s.barriers[req.Name]
	if b == nil {
		b = &barrier{n: n, release: make(chan struct{})}
		s.barriers[req.Name] = b
	}
	if b.n != n {
		s.mu.Unlock()
		return nil, status.Errorf(codes.InvalidArgument, "barrier %q entered with n=%d while %d participants already wait with n=%d", req.Name, n, b.arrived, b.n)
	}
	b.arrived++
	if b.arrived == b.n {
		// Last participant: release this generation; the name can be reused.
		close(b.release)
		delete(s.barriers, req.Name)
		s.mu.Unlock()
		return &pb.BarrierResponse{}, nil
	}
	s.mu.Unlock()
	select {
	case <-b.release:
		return &pb.BarrierResponse{}, nil
	case <-s.stopped:
		return nil, errStopped()
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-b.release:
		return &pb.BarrierResponse{}, nil
	default:
	}
	b.arrived--
	if b.arrived == 0 && s.barriers[req.Name] == b {
		delete(s.barriers, req.Name)
	}
	return nil, ctxErr(ctx)
}

func (v *service) Heartbeat(_ context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	s := v.s
	if err := s.checkRank(req.Rank); err != nil {
		return nil, err
	}
	rank := int(req.Rank)
	s.mu.Lock()
	// A rank that exited or was declared lost stays so; it is not monitored
	// again.
	if !s.exited[rank] && !s.lost[rank] {
		s.lastBeat[rank] = time.Now()
	}
	s.mu.Unlock()
	return &pb.HeartbeatResponse{}, nil
}

func (v *service) ReportExit(_ context.Context, req *pb.ReportExitRequest) (*pb.ReportExitResponse, error) {
	s := v.s
	if err := s.checkRank(req.Rank); err != nil {
		return nil, err
	}
	rank := int(req.Rank)
	s.mu.Lock()
	s.exited[rank] = true
	delete(s.lastBeat, rank)
	s.emit(Event{Kind: EventExited, Rank: rank, Code: int(req.Code), Reason: req.Reason})
	s.mu.Unlock()
	return &pb.ReportExitResponse{}, nil
}

// refusals are the server's TLS credentials, reporting each failed
// handshake as an EventRefused (at most one a second), so that the
// launcher hosting the job shows who knocked without the secret.
type refusals struct {
	credentials.TransportCredentials
	s *Server
}

func (c refusals) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		c.s.refused(conn.RemoteAddr(), err)
	}
	return out, info, err
}

func (c refusals) Clone() credentials.TransportCredentials {
	return refusals{c.TransportCredentials.Clone(), c.s}
}

// refused emits an EventRefused for a failed handshake from addr, unless
// one went out less than a second ago.
func (s *Server) refused(addr net.Addr, err error) {
	now := time.Now().UnixNano()
	last := s.lastRefusal.Load()
	if now-last < int64(time.Second) || !s.lastRefusal.CompareAndSwap(last, now) {
		return
	}
	s.emit(Event{Kind: EventRefused, Rank: -1, Reason: fmt.Sprintf("%v: TLS handshake failed (%v)", addr, err)})
}
