package launch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/titan-go/titan/internal/control"
)

// The c10d backend: the launcher that can bind the rendezvous endpoint
// hosts a memStore behind a small HTTP/JSON API over TLS on it; every launcher
// (the host too, through the network like the others) uses it through
// c10dClient. Every request carries the job secret in the header
// c10dSecretHeader; the server compares its hash in constant time and
// answers a wrong one with 403 and nothing else. When the host launcher
// ends, the rendezvous ends with it (as torchrun's c10d backend); use the
// etcd backend to survive the loss of any node.

const c10dSecretHeader = "Titan-Rdzv-Secret"

// c10dTLSLabel names the c10d rendezvous's TLS key: the server presents
// the certificate control.JobTLS derives from the job secret and this
// label, and clients accept only that key, so the secret in the header
// never reaches a server that does not hold it and never crosses the
// network in clear.
const c10dTLSLabel = "c10d rendezvous"

// c10dWaitPoll bounds one long-poll of Wait; the client polls again.
const c10dWaitPoll = 10 * time.Second

type c10dServer struct {
	store  *memStore
	srv    *http.Server
	lis    net.Listener
	secret [sha256.Size]byte
}

// listenC10d starts the c10d rendezvous server on addr. It returns an
// error wrapping syscall.EADDRINUSE when another launcher already hosts it.
func listenC10d(addr, secret string) (*c10dServer, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srvTLS, _, err := control.JobTLS(secret, c10dTLSLabel)
	if err != nil {
		lis.Close()
		return nil, err
	}
	lis = tls.NewListener(lis, srvTLS)
	s := &c10dServer{store: newMemStore(), lis: lis, secret: sha256.Sum256([]byte(secret))}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /rdzv/{op}", s.handle)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go s.srv.Serve(lis)
	return s, nil
}

// Close stops the server and its store.
func (s *c10dServer) Close() {
	s.srv.Close()
	s.store.Close()
}

// c10dRequest is the body of every call; the fields an op does not use are
// empty.
type c10dRequest struct {
	Key    string        `json:"key,omitempty"`
	Value  string        `json:"value,omitempty"`
	Old    string        `json:"old,omitempty"`
	Lease  int64         `json:"lease,omitempty"`
	TTL    time.Duration `json:"ttl,omitempty"`
	Rev    int64         `json:"rev,omitempty"`
	Prefix string        `json:"prefix,omitempty"`
}

type c10dResponse struct {
	OK    bool              `json:"ok,omitempty"`
	Lease int64             `json:"lease,omitempty"`
	KVs   map[string]string `json:"kvs,omitempty"`
	Rev   int64             `json:"rev,omitempty"`
	Gone  bool              `json:"gone,omitempty"` // the lease expired
	Err   string            `json:"err,omitempty"`
}

func (s *c10dServer) handle(w http.ResponseWriter, r *http.Request) {
	got := sha256.Sum256([]byte(r.Header.Get(c10dSecretHeader)))
	if subtle.ConstantTimeCompare(got[:], s.secret[:]) != 1 {
		http.Error(w, "refused", http.StatusForbidden)
		return
	}
	var req c10dRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	var resp c10dResponse
	var err error
	switch r.PathValue("op") {
	case "grant":
		resp.Lease, err = s.store.Grant(ctx, req.TTL)
	case "keepalive":
		err = s.store.KeepAlive(ctx, req.Lease)
	case "revoke":
		err = s.store.Revoke(ctx, req.Lease)
	case "create":
		resp.OK, err = s.store.Create(ctx, req.Key, req.Value, req.Lease)
	case "swap":
		resp.OK, err = s.store.Swap(ctx, req.Key, req.Old, req.Value)
	case "list":
		resp.KVs, resp.Rev, err = s.store.List(ctx, req.Prefix)
	case "wait":
		wctx, cancel := context.WithTimeout(ctx, c10dWaitPoll)
		err = s.store.Wait(wctx, req.Prefix, req.Rev)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			err = nil // nothing changed yet; the client asks again
		} else {
			resp.OK = err == nil
		}
	default:
		http.Error(w, "unknown op", http.StatusNotFound)
		return
	}
	if errors.Is(err, errLeaseGone) {
		resp.Gone = true
	} else if err != nil {
		resp.Err = err.Error()
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(&resp)
}

// c10dClient is an rdzvStore that calls a c10dServer.
type c10dClient struct {
	base   string
	secret string
	hc     *http.Client
}

func newC10dClient(endpoint, secret string) (*c10dClient, error) {
	_, cl, err := control.JobTLS(secret, c10dTLSLabel)
	if err != nil {
		return nil, err
	}
	return &c10dClient{base: "https://" + endpoint + "/rdzv/", secret: secret,
		hc: &http.Client{Timeout: c10dWaitPoll + 10*time.Second, Transport: &http.Transport{TLSClientConfig: cl, ForceAttemptHTTP2: true}}}, nil
}

func (c *c10dClient) call(ctx context.Context, op string, req c10dRequest) (c10dResponse, error) {
	body, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+op, bytes.NewReader(body))
	if err != nil {
		return c10dResponse{}, err
	}
	hr.Header.Set(c10dSecretHeader, c.secret)
	res, err := c.hc.Do(hr)
	if errors.Is(err, control.ErrNotJobServer) {
		// The TLS handshake failed before the secret was sent.
		return c10dResponse{}, fmt.Errorf("c10d rendezvous at %s refused this launcher: the host does not hold this launcher's job secret (%s differs)", c.base, EnvSecret)
	}
	if err != nil {
		return c10dResponse{}, fmt.Errorf("c10d rendezvous at %s: %w", c.base, err)
	}
	defer res.Body.Close()
	if res.StatusCode == http.StatusForbidden {
		return c10dResponse{}, fmt.Errorf("c10d rendezvous at %s refused this launcher: its job secret (%s) differs from the host's", c.base, EnvSecret)
	}
	if res.StatusCode != http.StatusOK {
		return c10dResponse{}, fmt.Errorf("c10d rendezvous at %s: %s", c.base, res.Status)
	}
	var resp c10dResponse
	if err := json.NewDecoder(io.LimitReader(res.Body, 16<<20)).Decode(&resp); err != nil {
		return c10dResponse{}, fmt.Errorf("c10d rendezvous at %s: reading the answer to %s: %w", c.base, op, err)
	}
	switch {
	case resp.Gone:
		return resp, errLeaseGone
	case resp.Err != "":
		return resp, fmt.Errorf("c10d rendezvous %s: %s", op, resp.Err)
	}
	return resp, nil
}

func (c *c10dClient) Grant(ctx context.Context, ttl time.Duration) (int64, error) {
	r, err := c.call(ctx, "grant", c10dRequest{TTL: ttl})
	return r.Lease, err
}

func (c *c10dClient) KeepAlive(ctx context.Context, lease int64) error {
	_, err := c.call(ctx, "keepalive", c10dRequest{Lease: lease})
	return err
}

func (c *c10dClient) Revoke(ctx context.Context, lease int64) error {
	_, err := c.call(ctx, "revoke", c10dRequest{Lease: lease})
	return err
}

func (c *c10dClient) Create(ctx context.Context, key, value string, lease int64) (bool, error) {
	r, err := c.call(ctx, "create", c10dRequest{Key: key, Value: value, Lease: lease})
	return r.OK, err
}

func (c *c10dClient) Swap(ctx context.Context, key, old, value string) (bool, error) {
	r, err := c.call(ctx, "swap", c10dRequest{Key: key, Old: old, Value: value})
	return r.OK, err
}

func (c *c10dClient) List(ctx context.Context, prefix string) (map[string]string, int64, error) {
	r, err := c.call(ctx, "list", c10dRequest{Prefix: prefix})
	return r.KVs, r.Rev, err
}

func (c *c10dClient) Wait(ctx context.Context, prefix string, rev int64) error {
	for {
		r, err := c.call(ctx, "wait", c10dRequest{Prefix: prefix, Rev: rev})
		if err != nil || r.OK {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
	}
}

func (c *c10dClient) Close() error {
	c.hc.CloseIdleConnections()
	return nil
}

// openC10d returns the c10d store at endpoint, hosting it when this
// launcher can bind the endpoint (the first launcher to start on that
// host), and the server to stop at the end (nil when another hosts it).
func openC10d(endpoint, secret string) (rdzvStore, *c10dServer, error) {
	host, _, _ := net.SplitHostPort(endpoint)
	if !isLoopback(host) && !isLocalHost(host) {
		c, err := newC10dClient(endpoint, secret)
		return c, nil, err
	}
	srv, err := listenC10d(listenAddrFor(endpoint), secret)
	switch {
	case err == nil:
	case errors.Is(err, syscall.EADDRINUSE), errors.Is(err, syscall.EADDRNOTAVAIL):
		srv = nil // another launcher hosts it (or the endpoint is another host's)
	default:
		return nil, nil, fmt.Errorf("c10d rendezvous: listening on %s: %w", endpoint, err)
	}
	c, err := newC10dClient(endpoint, secret)
	if err != nil {
		if srv != nil {
			srv.Close()
		}
		return nil, nil, err
	}
	return c, srv, nil
}

// isLocalHost reports whether host (a name or an IP) resolves to an
// address of one of this machine's interfaces.
func isLocalHost(host string) bool {
	ips, err := net.LookupIP(host)
	if err != nil {
		return false
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		for _, ip := range ips {
			if n.IP.Equal(ip) {
				return true
			}
		}
	}
	return false
}
