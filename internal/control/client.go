package control

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/titan-go/titan/internal/control/controlpb"
)

// DefaultDialTimeout is used when DialConfig.Timeout is zero.
const DefaultDialTimeout = 60 * time.Second

// DefaultHeartbeatInterval is used by StartHeartbeats when every is not
// positive.
const DefaultHeartbeatInterval = time.Second

// DialConfig configures a connection to a control server.
type DialConfig struct {
	// Endpoint is the server's host:port.
	Endpoint string
	// JobID and Secret are presented on every call.
	JobID  string
	Secret string
	// TLS, if non-nil, makes the client speak TLS with this configuration
	// (see LoadClientTLS). Without ServerName, the endpoint's host is
	// verified.
	TLS *tls.Config
	// Timeout bounds how long Dial keeps retrying while the server is not
	// reachable yet (default DefaultDialTimeout).
	Timeout time.Duration
}

// Client is a connection to a control server. Its methods are safe for
// concurrent use. A *Client satisfies the comm package's Store interface.
type Client struct {
	conn     *grpc.ClientConn
	rpc      pb.ControlClient
	endpoint string

	hbMu     sync.Mutex
	hbCancel context.CancelFunc
	hbDone   chan struct{}
	hbErrs   chan error

	closeOnce sync.Once
	closeErr  error
}

// Error is the error a Client method returns when the server refuses or
// fails a call. errors.Is matches ErrNotAdmitted,
// ErrRendezvousComplete, ErrSlotTaken, context.DeadlineExceeded and
// context.Canceled against the call's status code, and status.Code(err)
// gives the gRPC code.
type Error struct {
	Op       string // "join", "get", ...
	Endpoint string
	Code     codes.Code
	Message  string
}

// Error implements error.
func (e *Error) Error() string {
	if e.Code == codes.Unauthenticated {
		return fmt.Sprintf("control: %s at %s: %s (%s): the job id or the job secret this process presents is not the job's", e.Op, e.Endpoint, e.Message, e.Code)
	}
	return fmt.Sprintf("control: %s at %s: %s (%s)", e.Op, e.Endpoint, e.Message, e.Code)
}

// GRPCStatus returns the gRPC status of the failed call.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// Is reports whether the error matches one of the package's sentinel errors
// or a context error.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrNotAdmitted:
		return e.Code == codes.Unauthenticated
	case ErrRendezvousComplete:
		return e.Code == codes.FailedPrecondition && e.Op == "join"
	case ErrSlotTaken:
		return e.Code == codes.AlreadyExists && e.Op == "join"
	case context.DeadlineExceeded:
		return e.Code == codes.DeadlineExceeded
	case context.Canceled:
		return e.Code == codes.Canceled
	}
	return false
}

func (c *Client) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("control: %s at %s: %w", op, c.endpoint, err)
	}
	return &Error{Op: op, Endpoint: c.endpoint, Code: st.Code(), Message: st.Message()}
}

// Dial connects to the control server at cfg.Endpoint and checks the job id
// and secret with a first call. While the server is not reachable (workers
// often start before it listens) Dial retries until cfg.Timeout or ctx ends,
// then fails with an error naming the endpoint and the last connection
// error. A refused secret or job id fails at once, and so does a TLS
// handshake that fails (with JobTLS: a server that does not hold the job's
// secret, matched by ErrNotJobServer).
func Dial(ctx context.Context, cfg DialConfig) (*Client, error) {
	if _, _, err := net.SplitHostPort(cfg.Endpoint); err != nil {
		return nil, fmt.Errorf("control: endpoint %q: %w", cfg.Endpoint, err)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("control: dial timeout %v must not be negative", cfg.Timeout)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultDialTimeout
	}
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS.Clone())
	}
	auth := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataJobID, cfg.JobID, MetadataSecret, cfg.Secret)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	conn, err := grpc.NewClient(cfg.Endpoint,
		grpc.WithTransportCredentials(creds),
		grpc.WithUnaryInterceptor(auth),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize), grpc.MaxCallSendMsgSize(maxMsgSize)),
	)
	if err != nil {
		return nil, fmt.Errorf("control: endpoint %q: %w", cfg.Endpoint, err)
	}
	c := &Client{conn: conn, rpc: pb.NewControlClient(conn), endpoint: cfg.Endpoint, hbErrs: make(chan error, 1)}
	if err := c.ping(ctx, cfg.Timeout); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// ping calls Ping until it succeeds, fails for a reason retrying cannot fix,
// or timeout passes.
func (c *Client) ping(ctx context.Context, timeout time.Duration) error {
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	wait := 20 * time.Millisecond
	var last error
	for {
		_, err := c.rpc.Ping(dctx, &pb.PingRequest{})
		if err == nil {
			return nil
		}
		code := status.Code(err)
		msg := status.Convert(err).Message()
		if code != codes.Unavailable && code != codes.DeadlineExceeded && code != codes.Canceled {
			return c.wrap("dial", err)
		}
		// A failed TLS handshake is a configuration error; retrying cannot
		// fix it.
		if strings.Contains(msg, "authentication handshake failed") || strings.Contains(msg, "tls:") {
			if _, why, ok := strings.Cut(msg, ErrNotJobServer.Error()); ok {
				return fmt.Errorf("control: dial %s: TLS handshake failed: %w%s", c.endpoint, ErrNotJobServer, strings.TrimRight(why, `"`))
			}
			return fmt.Errorf("control: dial %s: TLS handshake failed: %s", c.endpoint, msg)
		}
		if code == codes.Unavailable || last == nil {
			last = err
		}
		select {
		case <-dctx.Done():
			if ctx.Err() != nil {
				return fmt.Errorf("control: dial %s: %w (last error: %s)", c.endpoint, ctx.Err(), status.Convert(last).Message())
			}
			return fmt.Errorf("control: could not reach the control server at %s within %v (is the launcher of node 0 running and the endpoint right?): %s", c.endpoint, timeout, status.Convert(last).Message())
		case <-time.After(wait):
		}
		wait = min(wait*2, 500*time.Millisecond)
	}
}

// Endpoint returns the server address the client was dialled with.
func (c *Client) Endpoint() string { return c.endpoint }

// Join registers this worker as local rank localRank of localWorldSize
// workers on node nodeRank, advertising addr to its peers, and blocks until
// all workers of the world have joined or ctx ends. Ranks are deterministic:
// rank = nodeRank*localWorldSize + localRank; every node must use the same
// localWorldSize. A wrong secret or job id, a slot already taken, a slot
// outside the world, or a rendezvous that is already complete is an error
// saying so. If ctx ends first, the slot is given back.
func (c *Client) Join(ctx context.Context, nodeRank, localRank, localWorldSize int, addr string) (rank, worldSize int, err error) {
	resp, err := c.rpc.Join(ctx, &pb.JoinRequest{
		NodeRank: int32(nodeRank), LocalRank: int32(localRank), LocalWorldSize: int32(localWorldSize), Addr: addr,
	})
	if err != nil {
		return 0, 0, c.wrap("join", err)
	}
	return int(resp.Rank), int(resp.WorldSize), nil
}

// Members returns the workers that have joined so far (by rank), the world
// size and whether the rendezvous is complete.
func (c *Client) Members(ctx context.Context) (members []Member, worldSize int, complete bool, err error) {
	resp, err := c.rpc.Members(ctx, &pb.MembersRequest{})
	if err != nil {
		return nil, 0, false, c.wrap("members", err)
	}
	for _, m := range resp.Members {
		members = append(members, Member{
			Rank: int(m.Rank), NodeRank: int(m.NodeRank), LocalRank: int(m.LocalRank),
			LocalWorldSize: int(m.LocalWorldSize), Addr: m.Addr, Peer: m.Peer,
		})
	}
	return members, int(resp.WorldSize), resp.Complete, nil
}

// Set stores value under key, replacing any previous value, and wakes every
// Get waiting for the key.
func (c *Client) Set(ctx context.Context, key string, value []byte) error {
	_, err := c.rpc.Set(ctx, &pb.SetRequest{Key: key, Value: value})
	return c.wrap(fmt.Sprintf("set %q", key), err)
}

// Get returns the value of key, blocking (on the server, without polling)
// until the key is set or ctx ends. A counter maintained by Add reads as its
// decimal text.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	resp, err := c.rpc.Get(ctx, &pb.GetRequest{Key: key})
	if err != nil {
		return nil, c.wrap(fmt.Sprintf("get %q", key), err)
	}
	if resp.Value == nil {
		return []byte{}, nil
	}
	return resp.Value, nil
}

// Wait blocks until every key in keys is set or ctx ends.
func (c *Client) Wait(ctx context.Context, keys ...string) error {
	_, err := c.rpc.Wait(ctx, &pb.WaitRequest{Keys: keys})
	return c.wrap(fmt.Sprintf("wait %q", keys), err)
}

// Add atomically adds delta to the integer counter stored under key (absent
// keys count as 0) and returns the new value.
func (c *Client) Add(ctx context.Context, key string, delta int64) (int64, error) {
	resp, err := c.rpc.Add(ctx, &pb.AddRequest{Key: key, Delta: delta})
	if err != nil {
		return 0, c.wrap(fmt.Sprintf("add %q", key), err)
	}
	return resp.Value, nil
}

// Barrier blocks until n participants have entered the barrier name, or ctx
// ends (the caller then leaves the barrier). Once released, the name can be
// used again for the next barrier. All participants must pass the same n.
func (c *Client) Barrier(ctx context.Context, name string, n int) error {
	_, err := c.rpc.Barrier(ctx, &pb.BarrierRequest{Name: name, N: int32(n)})
	return c.wrap(fmt.Sprintf("barrier %q", name), err)
}

// StartHeartbeats sends a heartbeat for rank now and then every interval
// (DefaultHeartbeatInterval if every is not positive) in the background,
// until StopHeartbeats or Close. Calling it again replaces the previous
// heartbeat loop. Failed heartbeats are reported on HeartbeatErrors.
func (c *Client) StartHeartbeats(rank int, every time.Duration) {
	if every <= 0 {
		every = DefaultHeartbeatInterval
	}
	c.StopHeartbeats()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c.hbMu.Lock()
	c.hbCancel, c.hbDone = cancel, done
	c.hbMu.Unlock()
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			bctx, bcancel := context.WithTimeout(ctx, max(every, time.Second))
			_, err := c.rpc.Heartbeat(bctx, &pb.HeartbeatRequest{Rank: int32(rank)})
			bcancel()
			if err != nil && ctx.Err() == nil {
				select {
				case c.hbErrs <- c.wrap(fmt.Sprintf("heartbeat of rank %d", rank), err):
				default: // an earlier error is still unread
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// StopHeartbeats stops the heartbeat loop, if any, and waits for it to end.
func (c *Client) StopHeartbeats() {
	c.hbMu.Lock()
	cancel, done := c.hbCancel, c.hbDone
	c.hbCancel, c.hbDone = nil, nil
	c.hbMu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// HeartbeatErrors delivers errors of failed heartbeats (at most one is
// buffered; later ones are dropped while it is unread). A worker may treat
// repeated failures as the loss of the control server.
func (c *Client) HeartbeatErrors() <-chan error { return c.hbErrs }

// ReportExit tells the server that rank exited with code for reason; the
// server emits an EventExited and stops monitoring the rank's heartbeats.
func (c *Client) ReportExit(ctx context.Context, rank, code int, reason string) error {
	_, err := c.rpc.ReportExit(ctx, &pb.ReportExitRequest{Rank: int32(rank), Code: int32(code), Reason: reason})
	return c.wrap(fmt.Sprintf("report exit of rank %d", rank), err)
}

// Close stops heartbeats and closes the connection. Calls in flight fail.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.StopHeartbeats()
		if err := c.conn.Close(); err != nil && !errors.Is(err, context.Canceled) {
			c.closeErr = fmt.Errorf("control: closing connection to %s: %w", c.endpoint, err)
		}
	})
	return c.closeErr
}
